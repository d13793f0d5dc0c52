// The attention explorer. Everything it draws comes from the JSON in #explorer-data, written by
// vit_einops.explore (see payload.py there for how the arrays are stored and how precise they are).
//
// One pane per model (one, or two side by side on the same images), all driven by the same controls.
// Numbering, as in the rest of vit-einops: layers, heads, tokens and classes count from 0. A model's tokens are
// its prefix tokens (pane.prefix: "cls", "dist", "reg1", ... in token order), then the patches: patch (row r,
// col c) of its gh x gw grid is token P + r * gw + c, P the number of prefix tokens.
"use strict";

const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
const $ = (id) => document.getElementById(id);

// What is shown: every pane is redrawn from this object whenever it changes. The query and the hovered key are
// said in the image's terms (a prefix token by name, or a point of the picture as fractions of its height and
// width), so that each pane finds its own token there whatever its grid.
const state = {
  image: 0,
  view: "attention", // attention | dino | rollout | relevance | norms | similarity | pca | method | decomposition
  layer: 0,
  head: "mean", // "mean" or a head index
  classRank: 0, // which of the image's relevance entries (its top classes, then the target) the relevance is for
  query: { prefix: "cls" }, // {prefix: name} or {point: [y, x]}
  opacity: 0.6, // of the heat map over the picture
  hover: null, // the key under the pointer, as the query is said
  mask: true, // draw DINO's mask in the DINO view
  method: null, // the explanation method's name in the method view (pane.data.methods[k].name)
  shared: false, // side by side: one colour scale for both panes (the larger top)
};

const PREFIX_KIND = { cls: "class token", dist: "distillation token" };
const PREFIX_COLOUR = { cls: "#d22", dist: "#8a2be2" }; // registers: REGISTER_COLOUR
const REGISTER_COLOUR = "#e08a00";

// ---- decoding ------------------------------------------------------------------------------------------

// base64 text -> zlib-inflated bytes, with the browser's built-in DecompressionStream ("deflate" is zlib).
async function inflate(text) {
  const bytes = Uint8Array.from(atob(text), (ch) => ch.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// IEEE 754 half precision -> number (written out: Float16Array is not in every browser yet).
function halfToNumber(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24; // subnormal
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

// float16 bytes (little-endian) times a scale -> Float64Array.
function halfMatrix(bytes, scale) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float64Array(bytes.byteLength / 2);
  for (let i = 0; i < out.length; i++) out[i] = halfToNumber(view.getUint16(2 * i, true)) * scale;
  return out;
}

function float32Array(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float64Array(bytes.byteLength / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

function loadPicture(png) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("the embedded picture cannot be decoded"));
    img.src = "data:image/png;base64," + png;
  });
}

// A pass's final tokens (N, D) as float16 times a scale -> unit rows (N * D): the similarity view's cosines.
function unitRows(bytes, scale, dim) {
  const rows = halfMatrix(bytes, scale);
  for (let t = 0; t < rows.length / dim; t++) {
    let norm = 0;
    for (let i = 0; i < dim; i++) norm += rows[t * dim + i] ** 2;
    norm = Math.sqrt(norm) || 1;
    for (let i = 0; i < dim; i++) rows[t * dim + i] /= norm;
  }
  return rows;
}

async function decodeImage(page, dim) {
  const pca = await loadPicture(page.pca); // one pixel per patch: its PCA colour (uint8 RGB)
  return {
    attention: await inflate(page.attention), // uint8 codes (layer, head, query, key), the first Q queries
    rowmax: float32Array(await inflate(page.attention_rowmax)), // (layer, head, query)
    mean: page.attention_mean === null ? null : await inflate(page.attention_mean), // (layer, query, key) or none
    meanRowmax: page.attention_mean === null ? null : float32Array(await inflate(page.attention_mean_rowmax)),
    tokens: unitRows(await inflate(page.tokens), page.tokens_scale, dim), // (token, dim), each of norm 1
    rollout: halfMatrix(await inflate(page.rollout), page.rollout_scale), // (query, key)
    relevance: await Promise.all(
      entries(page).map(async (c) => halfMatrix(await inflate(c.relevance), c.relevance_scale)),
    ),
    methods: await Promise.all(page.methods.map(async (m) => halfMatrix(await inflate(m.map), m.scale))),
    // Each head's share of the score by source token, (layer, head, token); null where the pane has no score.
    sources: page.decomposition === null
      ? null
      : halfMatrix(await inflate(page.decomposition.sources), page.decomposition.sources_scale),
    picture: await loadPicture(page.png),
    pca,
    pcaRgb: pixels(pca), // RGBA, patch p at 4 p
  };
}

// A picture's pixels, RGBA row-major.
function pixels(img) {
  const canvas = document.createElement("canvas");
  [canvas.width, canvas.height] = [img.width, img.height];
  const ctx = canvas.getContext("2d");
  ctx.drawImage(img, 0, 0);
  return ctx.getImageData(0, 0, img.width, img.height).data;
}

// ---- panes -----------------------------------------------------------------------------------------------

const panes = []; // {index, data, root, decoded[], N, P, GH, GW}

function makePane(data, index) {
  const root = $("pane-template").content.firstElementChild.cloneNode(true);
  root.id = `pane-${index}`;
  $("panes").append(root);
  return {
    index,
    data,
    root,
    decoded: [],
    prefix: data.layout.prefix,
    P: data.layout.prefix.length,
    GH: data.layout.grid[0],
    GW: data.layout.grid[1],
    N: data.layout.prefix.length + data.layout.grid[0] * data.layout.grid[1],
    el: (name) => root.querySelector(`.${name}`),
  };
}

// The layer and head this pane shows: the selected ones, or its own last where it has fewer (said above it).
function paneLayer(pane) {
  if (state.view === "dino") return pane.data.depth - 1;
  return Math.min(state.layer, pane.data.depth - 1);
}

function paneHead(pane) {
  return state.head === "mean" ? "mean" : Math.min(state.head, pane.data.heads - 1);
}

// A query or key said in the image's terms -> this pane's token (null: none).
function tokenOf(pane, where) {
  if (where === null) return null;
  if (where.prefix !== undefined) {
    const i = pane.prefix.indexOf(where.prefix);
    return i >= 0 ? i : null;
  }
  const [y, x] = where.point;
  const row = Math.min(Math.floor(y * pane.GH), pane.GH - 1);
  const col = Math.min(Math.floor(x * pane.GW), pane.GW - 1);
  return pane.P + row * pane.GW + col;
}

// The query this pane draws: in the DINO view the class token's row (-1: it has none), else the selected one,
// or where this model lacks that prefix token its first prefix token (the centre patch if it has none).
function paneQuery(pane) {
  if (state.view === "dino") return pane.prefix.indexOf("cls");
  const token = tokenOf(pane, state.query);
  if (token !== null) return token;
  return pane.P > 0 ? 0 : Math.floor(pane.GH / 2) * pane.GW + Math.floor(pane.GW / 2);
}

function prefixLabel(name) {
  if (PREFIX_KIND[name]) return PREFIX_KIND[name];
  const register = /^reg(\d+)$/.exec(name);
  return register ? `register token ${register[1]}` : name;
}

function prefixColour(name) {
  return PREFIX_COLOUR[name] || REGISTER_COLOUR;
}

function tokenName(pane, token) {
  if (token < pane.P) return `token ${token} (${prefixLabel(pane.prefix[token])})`;
  const p = token - pane.P;
  return `token ${token} (patch row ${Math.floor(p / pane.GW)}, col ${p % pane.GW})`;
}

// ---- the row being drawn: values over all N keys, and each value's error bound ------------------------

// Whether this pane's page holds the attention row asked for: each head's rows of the first Q queries (every
// query, or the prefix tokens' alone where the page left the rest out), and the mean of heads where it was kept.
function attentionStored(pane, head, query) {
  if (head === "mean" && pane.decoded[state.image].mean !== null) return true;
  return query < pane.data.attention_queries;
}

// The selected matrix's row for this pane: {values, bounds, name, digits}. bounds[j] is how far values[j] may
// be from the number the model computed (the quantisation of the stored arrays, see the footer). null where the
// pane has nothing to draw (missingReason says why: the DINO view of a model without a class token, or a row the
// page left out).
function currentRow(pane) {
  const N = pane.N;
  const d = pane.decoded[state.image];
  const page = pane.data.images[state.image];
  const values = new Float64Array(N);
  const bounds = new Float64Array(N);
  const layer = paneLayer(pane);
  const query = paneQuery(pane);
  if (state.view === "attention" || state.view === "dino") {
    if (query < 0) return null;
    const head = paneHead(pane);
    if (!attentionStored(pane, head, query)) return null;
    const named = head === "mean" ? "mean of heads" : `head ${head}`;
    const name = `attention A, layer ${layer}, ${named}`;
    if (head === "mean" && d.mean !== null) {
      // The mean of the heads, stored as its own row (quantised on its own maximum).
      const rowIndex = layer * N + query;
      const step = d.meanRowmax[rowIndex] / DATA.attention_levels;
      for (let j = 0; j < N; j++) {
        values[j] = d.mean[rowIndex * N + j] * step;
        bounds[j] = step / 2;
      }
      return { values, bounds, name, digits: "fixed" };
    }
    const Q = pane.data.attention_queries;
    const heads = head === "mean" ? [...Array(pane.data.heads).keys()] : [head];
    for (const h of heads) {
      const rowIndex = (layer * pane.data.heads + h) * Q + query;
      const step = d.rowmax[rowIndex] / DATA.attention_levels; // one uint8 step of this row
      for (let j = 0; j < N; j++) {
        values[j] += (d.attention[rowIndex * N + j] * step) / heads.length;
        bounds[j] += step / 2 / heads.length; // rounding to the nearest step: half a step
      }
    }
    return { values, bounds, name, digits: "fixed" };
  }
  if (state.view === "similarity") {
    // cos(z_q, z_j) of the final tokens: unit rows of float16 tokens, each cosine within 2^-9 (see the footer).
    const dim = pane.data.token_dim;
    for (let j = 0; j < N; j++) {
      let dot = 0;
      for (let i = 0; i < dim; i++) dot += d.tokens[query * dim + i] * d.tokens[j * dim + i];
      values[j] = dot;
      bounds[j] = DATA.cosine_bound;
    }
    return { values, bounds, name: "cosine similarity of the final tokens", digits: "fixed" };
  }
  if (state.view === "method") {
    // A map over the patches alone (gh, gw): the prefix tokens hold nothing here (drawPrefix says so).
    const k = pane.data.methods.findIndex((m) => m.name === state.method);
    if (k < 0) return null;
    const grid = d.methods[k];
    const scale = page.methods[k].scale;
    for (let p = 0; p < grid.length; p++) {
      values[pane.P + p] = grid[p];
      bounds[pane.P + p] = Math.abs(grid[p]) * DATA.half_relative + scale * DATA.half_subnormal;
    }
    return { values, bounds, name: pane.data.methods[k].label, digits: "significant" };
  }
  if (state.view === "decomposition") {
    // A head's share of the score from each source token (all N of them), or with "mean of heads" the layer's
    // heads summed: float16 like the methods' maps, the bounds of summed heads added.
    if (d.sources === null) return null;
    const head = paneHead(pane);
    const H = pane.data.heads;
    const heads = head === "mean" ? [...Array(H).keys()] : [head];
    const scale = page.decomposition.sources_scale;
    for (const h of heads) {
      for (let j = 0; j < N; j++) {
        const v = d.sources[(layer * H + h) * N + j];
        values[j] += v;
        bounds[j] += Math.abs(v) * DATA.half_relative + scale * DATA.half_subnormal;
      }
    }
    const named = head === "mean" ? `every head of layer ${layer}, summed` : `layer ${layer}, head ${head}`;
    return { values, bounds, name: `share of the score by source token, ${named}`, digits: "significant" };
  }
  if (state.view === "norms") {
    const norms = page.stats.norms[layer];
    for (let j = 0; j < N; j++) {
      values[j] = norms[j];
      bounds[j] = 5e-5; // stored rounded to 4 decimals
    }
    return { values, bounds, name: `token norm ||z||, after layer ${layer}`, digits: "significant" };
  }
  const matrix = state.view === "rollout" ? d.rollout : d.relevance[state.classRank];
  const cls = entries(page)[state.classRank];
  const scale = state.view === "rollout" ? page.rollout_scale : cls.relevance_scale;
  for (let j = 0; j < N; j++) {
    values[j] = matrix[query * N + j];
    bounds[j] = Math.abs(values[j]) * DATA.half_relative + scale * DATA.half_subnormal;
  }
  const name = state.view === "rollout" ? "rollout R (all layers, mean of heads)" : `relevance R for ${className(cls)}`;
  return { values, bounds, name, digits: "significant" };
}

// A number and its bound as printed: the bound adds the printing's own rounding and is rounded up.
function formatValue(value, bound, digits) {
  const text = digits === "fixed" ? value.toFixed(6) : value.toPrecision(6);
  const printing = digits === "fixed" ? 5e-7 : 5e-6 * Math.abs(value);
  return `${text} ± ${((bound + printing) * 1.01).toPrecision(3)}`;
}

// What relevance can be for on an image: its top classes (none for a model without a classifier), then the
// target given, if any.
function entries(page) {
  return page.target ? [...page.top, page.target] : page.top;
}

function className(c) {
  // A target has no index, its name says what its score is. A class's name is class_name()'s: the recorded name,
  // or "class i" where none is known.
  if (c.index === undefined) return `the target (${c.name})`;
  return c.name === `class ${c.index}` ? c.name : `${c.name} (class ${c.index})`;
}

// ---- drawing -----------------------------------------------------------------------------------------------

// Viridis, sampled at 9 points and interpolated linearly: dark blue (low) to yellow (high).
const VIRIDIS = [
  [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
];
function colour(t, alpha) {
  const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i;
  const rgb = VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  return `rgba(${rgb[0]}, ${rgb[1]}, ${rgb[2]}, ${alpha})`;
}

// DINO's mask of this pane's image and head (the last entry: the mean of heads), or null.
function dinoMask(pane) {
  const dino = pane.data.images[state.image].dino;
  if (dino === null) return null;
  const head = paneHead(pane);
  const k = head === "mean" ? pane.data.heads : head;
  return { mask: dino.masks[k], kept: dino.kept[k] };
}

// The heat map's top: this row's largest patch value, or with one scale for both panes the larger of theirs.
function scaleTop(pane, row, rows) {
  if (!state.shared || panes.length < 2) return patchPeak(pane, row);
  return Math.max(...panes.map((other, i) => (rows[i] === null ? 0 : patchPeak(other, rows[i]))));
}

function drawImage(pane, row, peak) {
  const canvas = pane.el("image-canvas");
  const ctx = canvas.getContext("2d");
  const d = pane.decoded[state.image];
  const { P, N, GH, GW } = pane;
  const cellW = canvas.width / GW;
  const cellH = canvas.height / GH;
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(d.picture, 0, 0, canvas.width, canvas.height);
  if (row === null) {
    pane.prefix.forEach((name, t) => {
      pane.el("prefix-tokens").children[t].textContent = `${name} (token ${t}, ${prefixLabel(name)})`;
    });
    pane.el("patch-mass").textContent = "";
    drawScale(pane, null, 0);
    return;
  }
  // Heat map over the patches, linear from 0 to ``peak`` (scaleTop: this row's largest patch value, or both
  // panes'); the prefix tokens are listed beside it, on the same scale, clipped.
  const scaled = (v) => (peak > 0 ? Math.min(Math.max(v / peak, 0), 1) : 0);
  for (let j = P; j < N; j++) {
    const p = j - P;
    ctx.fillStyle = colour(scaled(row.values[j]), state.opacity);
    ctx.fillRect((p % GW) * cellW, Math.floor(p / GW) * cellH, cellW, cellH);
  }
  // The patch grid.
  ctx.strokeStyle = "rgba(255, 255, 255, 0.35)";
  ctx.lineWidth = 1;
  for (let c = 1; c < GW; c++) line(ctx, c * cellW, 0, c * cellW, canvas.height);
  for (let r = 1; r < GH; r++) line(ctx, 0, r * cellH, canvas.width, r * cellH);
  // DINO's mask: the patches outside it hatched, its edge drawn in white.
  const dino = state.view === "dino" && state.mask ? dinoMask(pane) : null;
  if (dino !== null) drawMask(ctx, pane, dino.mask, cellW, cellH);
  // The query patch (dashed white) and the key under the pointer (solid red).
  const query = paneQuery(pane);
  if (!["norms", "dino", "method", "decomposition"].includes(state.view) && query >= P) {
    outline(ctx, pane, query, cellW, cellH, "#fff", [5, 3]);
  }
  const hover = tokenOf(pane, state.hover);
  if (hover !== null && hover >= P) outline(ctx, pane, hover, cellW, cellH, "#e22", []);
  drawPrefix(pane, row, scaled, query, hover);
  drawScale(pane, row, peak);
}

function drawMask(ctx, pane, mask, cellW, cellH) {
  const { GW } = pane;
  ctx.save();
  for (let p = 0; p < mask.length; p++) {
    if (mask[p]) continue;
    const x = (p % GW) * cellW;
    const y = Math.floor(p / GW) * cellH;
    ctx.fillStyle = "rgba(0, 0, 0, 0.45)";
    ctx.fillRect(x, y, cellW, cellH);
  }
  ctx.strokeStyle = "#fff";
  ctx.lineWidth = 2;
  const inside = (r, c) => r >= 0 && c >= 0 && r < pane.GH && c < GW && mask[r * GW + c] === 1;
  for (let p = 0; p < mask.length; p++) {
    if (!mask[p]) continue;
    const r = Math.floor(p / GW);
    const c = p % GW;
    const [x, y] = [c * cellW, r * cellH];
    if (!inside(r - 1, c)) line(ctx, x, y, x + cellW, y);
    if (!inside(r + 1, c)) line(ctx, x, y + cellH, x + cellW, y + cellH);
    if (!inside(r, c - 1)) line(ctx, x, y, x, y + cellH);
    if (!inside(r, c + 1)) line(ctx, x + cellW, y, x + cellW, y + cellH);
  }
  ctx.restore();
}

// The prefix tokens beside the map: each one's value in this row (for attention: the share of the query's mass
// on it), coloured on the map's scale; and the patches' total.
function drawPrefix(pane, row, scaled, query, hover) {
  const items = pane.el("prefix-tokens").children;
  if (state.view === "method") {
    pane.prefix.forEach((name, t) => {
      items[t].textContent = `${name} (token ${t}, ${prefixLabel(name)}): not on this map`;
      items[t].style.background = "";
      items[t].style.color = "";
      items[t].classList.toggle("query", false);
      items[t].classList.toggle("hovered", t === hover);
    });
    pane.el("patch-mass").textContent = "the method's map covers the patches alone";
    return;
  }
  let prefixSum = 0;
  pane.prefix.forEach((name, t) => {
    const item = items[t];
    const value = row.values[t];
    prefixSum += value;
    item.textContent = `${name} (token ${t}, ${prefixLabel(name)}): ${formatValue(value, row.bounds[t], row.digits)}`;
    item.dataset.value = String(value);
    item.style.background = colour(scaled(value), 0.8);
    item.style.color = scaled(value) > 0.6 ? "#000" : "#fff";
    item.style.borderColor = prefixColour(name);
    item.classList.toggle("query", t === query && state.view !== "norms");
    item.classList.toggle("hovered", t === hover);
  });
  let patches = 0;
  for (let j = pane.P; j < pane.N; j++) patches += row.values[j];
  const line = pane.el("patch-mass");
  if (state.view === "attention" || state.view === "dino") {
    line.textContent =
      `share of the query's attention: prefix tokens ${prefixSum.toFixed(4)}, patches ${patches.toFixed(4)}` +
      " (each row of A sums to 1)";
  } else if (state.view === "norms") {
    line.textContent = pane.P ? "norms of the prefix tokens, on the map's scale (clipped at its top)" : "";
  } else if (state.view === "similarity") {
    line.textContent = pane.P ? "the prefix tokens' cosines to the query's token, on the map's scale" : "";
  } else {
    line.textContent =
      `this row on the prefix tokens ${prefixSum.toPrecision(4)}, on the patches ${patches.toPrecision(4)}`;
  }
  if (!pane.P) line.textContent = "this model has no prefix tokens: every token is a patch";
}

// The largest value over the patches: the top of the colour scale.
function patchPeak(pane, row) {
  let peak = 0;
  for (let j = pane.P; j < pane.N; j++) peak = Math.max(peak, row.values[j]);
  return peak;
}

// The colour scale under the picture: its ramp and range, in every view. data-min / data-max hold the exact
// numbers (the text rounds them).
function drawScale(pane, row, peak) {
  const bar = pane.el("scale-bar");
  const ctx = bar.getContext("2d");
  for (let x = 0; x < bar.width; x++) {
    ctx.fillStyle = colour(x / (bar.width - 1), 1);
    ctx.fillRect(x, 0, 1, bar.height);
  }
  const box = pane.el("colour-scale");
  box.dataset.min = "0";
  box.dataset.max = String(peak);
  pane.el("scale-min").textContent = "0";
  pane.el("scale-max").textContent = peak.toPrecision(4);
  if (row === null) {
    pane.el("scale-line").textContent = "";
    return;
  }
  const above = pane.prefix.filter((_, t) => peak > 0 && row.values[t] > peak);
  const clipped = above.length ? `; above the scale, drawn at its top: ${above.join(", ")}` : "";
  const negative = row.values.some((v) => v < 0) ? "; below 0, drawn as 0" : "";
  const whose = state.shared && panes.length > 1 ? " of either model (one scale for both)" : "";
  pane.el("scale-line").textContent =
    `colour: linear from 0 (dark blue) to ${peak.toPrecision(4)} (yellow), the largest value on a patch in ` +
    `this ${state.view === "norms" ? "layer" : "row"}${whose}${clipped}${negative}`;
}

function line(ctx, x0, y0, x1, y1) {
  ctx.beginPath();
  ctx.moveTo(x0, y0);
  ctx.lineTo(x1, y1);
  ctx.stroke();
}

function outline(ctx, pane, token, cellW, cellH, style, dash) {
  const p = token - pane.P;
  ctx.save();
  ctx.strokeStyle = style;
  ctx.lineWidth = 2.5;
  ctx.setLineDash(dash);
  ctx.strokeRect((p % pane.GW) * cellW + 1, Math.floor(p / pane.GW) * cellH + 1, cellW - 2, cellH - 2);
  ctx.restore();
}

// Which row is drawn, said the same way in the line under the picture and in the footer.
// Why a pane draws no row: DINO's view of a model without a class token, or a row this page left out.
function missingReason(pane) {
  if (state.view === "dino" && paneQuery(pane) < 0) {
    return "nothing: this model has no class token, whose attention DINO's view shows";
  }
  const head = paneHead(pane);
  return `nothing: ${head === "mean" ? "the mean of heads' row" : `head ${head}'s row`} of ` +
    `${tokenName(pane, paneQuery(pane))} was left out of this page (see the note above the map)`;
}

function rowName(pane, row) {
  if (row === null && state.view === "method") return `nothing: ${state.method} was not computed for this model`;
  if (row === null && state.view === "decomposition") return "nothing: this model's score was not decomposed";
  if (state.view === "decomposition") return `${row.name} (every source token; no query row)`;
  if (row === null) return missingReason(pane);
  if (state.view === "norms") return `${row.name} (every token; no query row)`;
  if (state.view === "method") return `${row.name} (the patch grid; no query row)`;
  const q = paneQuery(pane);
  return `${row.name}, row ${q}: query ${tokenName(pane, q)}`;
}

function drawLegend(pane) {
  const q = paneQuery(pane);
  const hover = tokenOf(pane, state.hover);
  const noQuery = { norms: "token norms have", method: "a method's map has", decomposition: "a head's source map has" };
  pane.el("legend-query").textContent =
    noQuery[state.view] !== undefined
      ? `query (dashed white box): none, ${noQuery[state.view]} no query`
      : `query (dashed white box${q < pane.P ? "; for a prefix token, the dashed box beside the map" : ""}): ` +
        (q < 0 ? "none" : tokenName(pane, q));
  pane.el("legend-hover").textContent =
    `hovered key (red box): ${hover === null ? "none" : tokenName(pane, hover)}`;
  const head = paneHead(pane);
  const named = head === "mean" ? "mean of heads (all blue)" : `head ${head}`;
  const used = { attention: "", dino: "", rollout: "; the rollout uses every head",
    relevance: "; relevance uses every head", norms: "; token norms have no heads",
    similarity: "; the similarity reads the final tokens, not a head",
    method: "; the method's map is its own (its parameters in its name)",
    decomposition: "; the mean of heads is the layer's heads summed here" }[state.view];
  pane.el("legend-head").textContent = `selected head (charts: blue dots, the others grey): ${named}${used}`;
  const layers = ["rollout", "relevance"].includes(state.view)
    ? `; the ${state.view} combines every layer`
    : state.view === "method" ? "; the method reads the layers its parameters name"
    : state.view === "similarity" ? "; the similarity reads the final tokens (after the last layer)" : "";
  pane.el("legend-layer").textContent =
    `selected layer (yellow column in the charts): layer ${paneLayer(pane)}${layers}`;
}

// Where this pane shows other than what the controls select (fewer layers or heads, no such prefix token).
function clampNote(pane) {
  const notes = [];
  const allLayers = ["rollout", "relevance", "method"].includes(state.view);
  if (state.view !== "dino" && state.layer > pane.data.depth - 1 && !allLayers) {
    notes.push(`this model has ${pane.data.depth} layers: layer ${state.layer} is past its last, layer ` +
      `${pane.data.depth - 1} is shown`);
  }
  const headed = ["attention", "dino", "decomposition"].includes(state.view);
  if (state.head !== "mean" && state.head > pane.data.heads - 1 && headed) {
    notes.push(`this model has ${pane.data.heads} heads: head ${state.head} is past its last, head ` +
      `${pane.data.heads - 1} is shown`);
  }
  const missing = state.query.prefix !== undefined && !pane.prefix.includes(state.query.prefix);
  if (!["dino", "method"].includes(state.view) && missing) {
    notes.push(`this model has no ${state.query.prefix} token: its ${tokenName(pane, paneQuery(pane))} is the query`);
  }
  return notes.join("; ");
}

// Why a map looks the way it does, where that is not its data's fault: identity relevance, a row with nothing
// on the patches, and which row of R is the usual one.
function viewNote(pane, row) {
  const notes = [];
  const cls = entries(pane.data.images[state.image])[state.classRank];
  if (row === null && state.view === "decomposition") {
    notes.push(`The decomposition splits a class's or a target's score: this model has no classifier and the page ` +
      "no target.");
  } else if (state.view === "decomposition") {
    const head = paneHead(pane);
    const dec = pane.data.images[state.image].decomposition;
    const layer = paneLayer(pane);
    const share = head === "mean" ? dec.heads[layer].reduce((a, b) => a + b, 0) : dec.heads[layer][head];
    notes.push(`Gandelsman et al. 2024: each source token j's part of the head's direct share of the score, ` +
      `Σ_i A_ij r_i · v_j W_O (r the final norm and head read at their observed scale); over every token it sums to ` +
      `the share ${share.toPrecision(6)}. It decomposes ${explained(pane)}. Negative parts are drawn as 0` +
      (patchPeak(pane, row) <= 0 ? "; no patch adds to the score here, so the map is blank." : "."));
  } else if (row === null && state.view === "method") {
    notes.push(`${state.method} explains a class or a target: this model has no classifier and the page no target.`);
  } else if (row === null && state.view === "dino") {
    notes.push("This model has no class token (no \"cls\" among its prefix tokens), so it has no class-token " +
      "attention for DINO's view; the attention view shows any query's row.");
  } else if (row === null) {
    notes.push(`At ${pane.N.toLocaleString("en")} tokens this page keeps ` +
      (pane.data.attention_queries ? "each head's rows of the prefix tokens" : "no head's rows") +
      (pane.decoded[state.image].mean !== null ? " and the mean of heads for every query" : "") +
      ": choose " + (pane.decoded[state.image].mean !== null ? "the mean of heads or " : "") +
      (pane.P ? "a prefix token as the query" : "another view") + ".");
  } else if (state.view === "relevance" && cls.relevance_identity && cls.index === undefined) {
    notes.push("Relevance is the identity matrix for this target: its score does not depend on the attention.");
  } else if (state.view === "relevance" && cls.relevance_identity) {
    notes.push(
      "Relevance is the identity matrix for this class: no head's gradient-weighted attention " +
        "(∂y/∂A ⊙ A)⁺ is positive, so every row holds its own token alone and the patches get 0. The class's " +
        "logit does not depend on the attention: a zero-initialised classification head (a new or reset " +
        "classifier, as the paper initialises it) gives ∂y/∂A = 0.",
    );
  } else if (state.view === "method") {
    const method = pane.data.methods.find((m) => m.name === state.method);
    const what = method.gradient ? ` It explains ${explained(pane)}.` : "";
    notes.push(`${method.label}: ${method.reference}.${what}` +
      (patchPeak(pane, row) <= 0 ? " The map is 0 on every patch." : ""));
  } else if (state.view !== "norms" && patchPeak(pane, row) <= 0) {
    notes.push("This row puts no weight on any patch (all of it on the prefix tokens), so the map is blank.");
  }
  const q = paneQuery(pane);
  if (["rollout", "relevance"].includes(state.view) && q >= pane.P) {
    const which =
      state.query.point !== undefined ? "the clicked patch's" : "the centre patch's, while no patch is clicked";
    notes.push(pane.prefix.includes("cls")
      ? `Shown: row ${q}, ${which}. The class token's row (what the classifier reads) is the usual map: click ` +
        "the class token beside the map to show it."
      : `Shown: row ${q}, ${which}. This model has no class token: its output pools the patch tokens (attention ` +
        "pooling or their mean), so no single row is what it reads; click any patch to show its row.");
  }
  return notes.join(" ");
}

// DINO's view in words: which head's mask, how many patches it keeps and how much mass they hold. data-mask
// lists the kept patches (row-major patch indices).
function dinoLine(pane) {
  const box = pane.el("dino-line");
  if (state.view !== "dino") {
    box.textContent = "";
    box.dataset.mask = "";
    return;
  }
  const dino = dinoMask(pane);
  if (dino === null) {
    box.textContent = "DINO's mask: none, this model has no class token";
    box.dataset.mask = "";
    return;
  }
  const kept = dino.mask.flatMap((m, p) => (m ? [p] : []));
  box.dataset.mask = kept.join(",");
  const head = paneHead(pane);
  const which = `DINO's mask (Caron et al. 2021) for ${head === "mean" ? "the mean of heads" : `head ${head}`}, ` +
    `layer ${pane.data.depth - 1}: `;
  if (dino.kept === null) {
    box.textContent = which + "none, the class token puts no attention on the patches";
    return;
  }
  const keep = Math.round(100 * pane.data.dino_keep);
  box.textContent =
    which + `the ${kept.length} highest of ${dino.mask.length} patches that hold ${keep}% of the class token's ` +
    `attention over the patches; they hold ${(100 * dino.kept).toFixed(1)}%` + (state.mask ? "" : " (mask hidden)");
}

function drawReadout(pane, row) {
  pane.el("query-line").textContent = rowName(pane, row);
  pane.el("footer-row").textContent = `Drawn over the patches: ${rowName(pane, row)}.`;
  pane.el("view-note").textContent = viewNote(pane, row);
  pane.el("clamp-note").textContent = clampNote(pane);
  dinoLine(pane);
  drawLegend(pane);
  const key = tokenOf(pane, state.hover);
  if (key === null || row === null) {
    pane.el("readout").textContent = "move the pointer over a patch (or a prefix token)";
    return;
  }
  if (state.view === "method" && key < pane.P) {
    pane.el("readout").textContent = `${tokenName(pane, key)}: not on this map (it covers the patches alone)`;
    return;
  }
  const what = { attention: "weight", dino: "weight", rollout: "weight", relevance: "relevance", norms: "norm",
    similarity: "cosine", method: "value", decomposition: "share" }[state.view];
  const query = ["norms", "method", "decomposition"].includes(state.view) ? "" : `query ${paneQuery(pane)} · `;
  pane.el("readout").textContent =
    `${query}key ${key} · ${what} ${formatValue(row.values[key], row.bounds[key], row.digits)} · ` +
    tokenName(pane, key);
}

// ---- patch PCA (DINOv2's picture): each patch's colour over the picture --------------------------------------

function drawPca(pane) {
  const canvas = pane.el("image-canvas");
  const ctx = canvas.getContext("2d");
  const d = pane.decoded[state.image];
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(d.picture, 0, 0, canvas.width, canvas.height);
  ctx.globalAlpha = state.opacity;
  ctx.drawImage(d.pca, 0, 0, canvas.width, canvas.height); // one pixel per patch, scaled without smoothing
  ctx.globalAlpha = 1;
  const hover = tokenOf(pane, state.hover);
  if (hover !== null && hover >= pane.P) {
    outline(ctx, pane, hover, canvas.width / pane.GW, canvas.height / pane.GH, "#e22", []);
  }
  pane.prefix.forEach((name, t) => {
    const item = pane.el("prefix-tokens").children[t];
    item.textContent = `${name} (token ${t}, ${prefixLabel(name)})`;
    item.style.background = "";
    item.style.color = "";
  });
  const ratios = pane.data.pca_explained.map((r) => `${(100 * r).toFixed(1)}%`).join(", ");
  const last = pane.data.pca_explained.length - 1;
  const name = `patch PCA of the last layer's normed patch tokens (components 0..${last} as red, green, blue; ` +
    `${ratios} of the variance)`;
  pane.el("query-line").textContent = name;
  pane.el("footer-row").textContent = `Drawn over the patches: ${name}.`;
  pane.el("patch-mass").textContent = pane.P ? "the prefix tokens are left out of the PCA" : "";
  pane.el("scale-line").textContent = "colour: each component min-max scaled over this model's patches of every image";
  pane.el("view-note").textContent =
    `One PCA over this model's own patch tokens of all ${DATA.titles.length} image(s) together (Oquab et al. 2024, ` +
    "DINOv2); beside another model its colours are that model's own fit, not comparable component by component. " +
    "Register tokens change this picture (dinov2 issue #469).";
  pane.el("clamp-note").textContent = "";
  dinoLine(pane);
  pane.el("legend-query").textContent = "query (dashed white box): none, the PCA has no query";
  pane.el("legend-hover").textContent = `hovered key (red box): ${hover === null ? "none" : tokenName(pane, hover)}`;
  pane.el("legend-head").textContent = "selected head: none, the PCA reads the tokens of every head";
  pane.el("legend-layer").textContent = `selected layer: the PCA reads layer ${pane.data.depth - 1}, the last`;
  pane.el("readout").textContent = "move the pointer over a patch";
  if (hover !== null && hover >= pane.P) {
    const p = hover - pane.P;
    const [r, g, b] = d.pcaRgb.slice(4 * p, 4 * p + 3);
    pane.el("readout").textContent = `${tokenName(pane, hover)} · colour rgb(${r}, ${g}, ${b})`;
  }
}

// ---- the score decomposed: an L x H grid of the heads' shares, the MLPs beside it, the rest, the logit lens -------

// A share on a diverging scale: 0 white, +top red, -top blue.
function diverging(value, top) {
  const t = top > 0 ? Math.min(Math.abs(value) / top, 1) : 0;
  const [r, g, b] = value >= 0 ? [178, 24, 43] : [33, 102, 172];
  const mix = (c) => Math.round(255 + t * (c - 255));
  return `rgb(${mix(r)}, ${mix(g)}, ${mix(b)})`;
}

function cell(className, text, value, title) {
  const div = document.createElement("div");
  div.className = className;
  div.textContent = text;
  if (value !== undefined) div.dataset.value = String(value);
  if (title !== undefined) div.title = title;
  return div;
}

// The grid and the strip are rebuilt when the image changes (data-value: the payload's number exactly), the chosen
// head marked on every update. The grid: one row per layer, one column per head, then the layer's MLP.
function drawDecomposition(pane) {
  const box = pane.el("decomposition");
  const dec = pane.data.images[state.image].decomposition;
  box.hidden = state.view !== "decomposition";
  if (dec === null) {
    pane.el("decomp-line").textContent = pane.data.decomposition_note;
    for (const name of ["decomp-grid", "lens-strip"]) pane.el(name).replaceChildren();
    for (const name of ["decomp-readout", "decomp-rest", "lens-line"]) pane.el(name).textContent = "";
    return;
  }
  const { depth, heads } = pane.data;
  if (pane.decompFor !== state.image) {
    pane.decompFor = state.image;
    const top = Math.max(...dec.heads.flat().map(Math.abs), ...dec.mlps.map(Math.abs));
    const grid = pane.el("decomp-grid");
    grid.style.gridTemplateColumns = `5.5em repeat(${heads}, minmax(14px, 1fr)) 0.8em minmax(3em, 2fr)`;
    const items = [cell("", ""), ...[...Array(heads).keys()].map((h) => cell("", `h${h}`)), cell("", ""),
      cell("", "MLP")];
    for (let l = 0; l < depth; l++) {
      items.push(cell("", `layer ${l}`));
      dec.heads[l].forEach((share, h) => {
        const item = cell("head-cell", "", share, `layer ${l}, head ${h}: share ${share.toPrecision(6)} (click: ` +
          "its source map)");
        item.dataset.layer = String(l);
        item.dataset.head = String(h);
        item.style.background = diverging(share, top);
        item.addEventListener("click", () => update({ view: "decomposition", layer: l, head: h }));
        items.push(item);
      });
      items.push(cell("", ""));
      const mlp = cell("mlp-cell", "", dec.mlps[l], `layer ${l}'s MLP: share ${dec.mlps[l].toPrecision(6)} (it ` +
        "reads each token alone: no source map)");
      mlp.style.background = diverging(dec.mlps[l], top);
      items.push(mlp);
    }
    grid.replaceChildren(...items);
    const sum = (values) => values.reduce((a, b) => a + b, 0);
    const headsSum = sum(dec.heads.flat());
    const mlpsSum = sum(dec.mlps);
    pane.el("decomp-rest").textContent =
      `total ${dec.total.toPrecision(6)} = heads ${headsSum.toPrecision(6)} + MLPs ${mlpsSum.toPrecision(6)} + ` +
      `rest ${dec.rest.toPrecision(6)} (${dec.parts.map(([name, v]) => `${name} ${v.toPrecision(4)}`).join("; ")})`;
    pane.el("decomp-rest").dataset.rest = String(dec.rest);
    const low = Math.min(...dec.lens);
    const high = Math.max(...dec.lens);
    const strip = pane.el("lens-strip");
    strip.style.gridTemplateColumns = `repeat(${depth + 1}, minmax(14px, 1fr))`;
    strip.replaceChildren(...dec.lens.map((v, l) => {
      const where = l === 0 ? "the embeddings" : `layer ${l - 1}`;
      const item = cell("lens-cell", l === 0 ? "emb" : String(l - 1), v, `after ${where}: score ${v.toPrecision(6)}`);
      item.style.background = colour(high > low ? (v - low) / (high - low) : 0.5, 0.8);
      item.style.color = high > low && (v - low) / (high - low) > 0.6 ? "#000" : "#fff";
      return item;
    }));
    pane.el("lens-line").textContent =
      `from ${dec.lens[0].toPrecision(4)} after the embeddings to ${dec.lens[depth].toPrecision(4)} after layer ` +
      `${depth - 1} (the model's score); colour: viridis from ${low.toPrecision(4)} to ${high.toPrecision(4)}`;
  }
  pane.el("decomp-line").textContent =
    `the score of ${explained(pane)}: red adds to it, blue takes from it (white 0, full colour the largest share)`;
  const layer = paneLayer(pane);
  const head = paneHead(pane);
  for (const item of pane.el("decomp-grid").querySelectorAll(".head-cell")) {
    const chosen = Number(item.dataset.layer) === layer && (head === "mean" || Number(item.dataset.head) === head);
    item.classList.toggle("chosen", chosen && state.view === "decomposition");
  }
  const share = head === "mean" ? dec.heads[layer].reduce((a, b) => a + b, 0) : dec.heads[layer][head];
  const named = head === "mean" ? `every head of layer ${layer}` : `layer ${layer}, head ${head}`;
  const readout = pane.el("decomp-readout");
  readout.textContent = `${named}: share ${share.toPrecision(6)} of the total ${dec.total.toPrecision(6)}`;
  readout.dataset.share = String(share);
}

// ---- the selected layer's token norms, token by token: prefix tokens marked, the patches' outliers named ------

const TOKEN_CHART = { left: 52, right: 8, top: 8, bottom: 20, slot: 30, gap: 8 };

// Each prefix token has a slot of its own at the left, wide enough for its bar and its name under it; the patches
// share the rest, a bar each (at 1,369 patches several to a pixel). data-labels holds each name's box [left,
// right, top, bottom] in canvas pixels, so that a test can see that no two overlap.
function drawTokenChart(pane) {
  const canvas = pane.el("token-chart");
  const ctx = canvas.getContext("2d");
  const layer = paneLayer(pane);
  const norms = pane.data.images[state.image].stats.norms[layer];
  const { N, P } = pane;
  const high = Math.max(...norms);
  const low = Math.min(0, ...norms);
  const pad = TOKEN_CHART;
  const patchLeft = pad.left + (P ? P * pad.slot + pad.gap : 0);
  const patchWidth = (canvas.width - patchLeft - pad.right) / (N - P);
  const x = (t) => (t < P ? pad.left + (t + 0.5) * pad.slot : patchLeft + (t - P + 0.5) * patchWidth);
  const width = (t) => (t < P ? pad.slot - 8 : Math.max(1, Math.min(2, patchWidth)));
  const plotH = canvas.height - pad.top - pad.bottom;
  const y = (v) => canvas.height - pad.bottom - ((v - low) / (high - low || 1)) * plotH;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#333";
  ctx.font = "10px sans-serif";
  ctx.fillText(high.toPrecision(4), 2, pad.top + 8);
  ctx.fillText(low.toPrecision(4), 2, canvas.height - pad.bottom);
  norms.forEach((v, t) => {
    ctx.fillStyle = t < P ? prefixColour(pane.prefix[t]) : "rgba(40, 90, 160, 0.8)";
    ctx.fillRect(x(t) - width(t) / 2, y(v), width(t), canvas.height - pad.bottom - y(v));
  });
  const labels = pane.prefix.map((name, t) => {
    // Names wider than a slot (none of cls, dist, reg1..reg99 at this font) take turns on two lines.
    const w = ctx.measureText(name).width;
    const row = w > pad.slot - 2 ? t % 2 : 0;
    const [left, base] = [x(t) - w / 2, canvas.height - 6 - row * 10];
    ctx.fillStyle = prefixColour(name);
    ctx.fillText(name, left, base);
    return [left, left + w, base - 9, base];
  });
  if (N > P) {
    ctx.fillStyle = "#333";
    ctx.fillText(`patches ${P}..${N - 1}`, patchLeft, canvas.height - 6);
    labels.push([patchLeft, patchLeft + ctx.measureText(`patches ${P}..${N - 1}`).width, canvas.height - 15,
      canvas.height - 6]);
  }
  canvas.dataset.labels = JSON.stringify(labels);
  // The patches' median and their highest norms: the register paper's artifact is a few patches far above it.
  const patches = norms.slice(P).map((v, p) => [v, p]).sort((a, b) => b[0] - a[0]);
  const median = patches[Math.floor(patches.length / 2)][0];
  const highest = patches.slice(0, 3).map(([v, p]) => `${v.toFixed(2)} (${tokenName(pane, P + p)})`);
  const prefix = pane.prefix.map((name, t) => `${name} ${norms[t].toFixed(2)}`);
  pane.el("norm-line").textContent =
    `after layer ${layer}: ` + (prefix.length ? `prefix tokens ${prefix.join(", ")}; ` : "") +
    `patches: median ${median.toFixed(2)}, highest ${highest.join(", ")}`;
}

// ---- charts: one small scatter per statistic, x = layer, one dot per head ------------------------------------

const CHARTS = [
  { key: "distance", title: "mean attention distance (px)", refName: "uniform" },
  { key: "entropy", title: "attention entropy (nats)", refName: "log n" },
  { key: "prefix_share", title: "share of the patches' attention on the prefix tokens", refName: "P/n" },
  { key: "norms", title: "token norms (prefix tokens in colour)", refName: null },
];

function chartReference(pane, chart) {
  if (chart.key === "distance") return pane.data.uniform_distance;
  if (chart.key === "entropy") return pane.data.uniform_entropy;
  if (chart.key === "prefix_share") return pane.P / pane.N;
  return null;
}

// A statistic by layer and head: prefix_share is summed over the prefix tokens.
function chartValues(pane, chart, layer) {
  const values = pane.data.images[state.image].stats[chart.key][layer];
  return chart.key === "prefix_share" ? values.map((shares) => shares.reduce((a, b) => a + b, 0)) : values;
}

// The mean attention distance of a head whose patches attend only to the prefix tokens (no attention between
// patches: patch mass 0) is undefined.
const NOT_DEFINED = "n/a (attends only to the prefix tokens)";
const CHART_W = 300;
const CHART_H = 150;
const PAD = { left: 52, right: 8, top: 8, bottom: 20 };

function chartPoints(pane, chart) {
  // [{layer, y, label, colour, size}] for the current image.
  const points = [];
  const query = paneQuery(pane);
  const head = paneHead(pane);
  for (let l = 0; l < pane.data.depth; l++) {
    chartValues(pane, chart, l).forEach((y, i) => {
      if (chart.key === "norms") {
        const isQuery = i === query;
        const patch = isQuery ? "#000" : "rgba(40, 90, 160, 0.35)";
        const colour = i < pane.P ? prefixColour(pane.prefix[i]) : patch;
        points.push({ layer: l, y, label: `layer ${l}, ${tokenName(pane, i)}: norm ${y.toFixed(4)}`, colour,
          size: isQuery || i < pane.P ? 3 : 1.6 });
      } else if (y === null) {
        // Undefined (payload.py writes null): drawn hollow on the bottom edge.
        points.push({ layer: l, y: null, label: `layer ${l}, head ${i}: ${NOT_DEFINED}`, colour: "#b00", size: 3 });
      } else {
        const chosen = head === "mean" || head === i;
        points.push({ layer: l, y, label: `layer ${l}, head ${i}: ${y.toFixed(4)}`,
          colour: chosen ? "rgba(40, 90, 160, 0.9)" : "rgba(150, 150, 150, 0.5)", size: chosen ? 2.6 : 2 });
      }
    });
  }
  return points;
}

function chartScale(pane, points, reference) {
  const ys = points.filter((p) => p.y !== null).map((p) => p.y);
  let low = ys.length ? Math.min(...ys) : 0;
  let high = ys.length ? Math.max(...ys) : 1;
  if (reference !== null) {
    low = Math.min(low, reference);
    high = Math.max(high, reference);
  }
  if (high - low < 1e-12) high = low + 1;
  const x = (layer) => PAD.left + ((layer + 0.5) / pane.data.depth) * (CHART_W - PAD.left - PAD.right);
  const plotH = CHART_H - PAD.top - PAD.bottom;
  const y = (v) => CHART_H - PAD.bottom - (v === null ? 0 : ((v - low) / (high - low)) * plotH);
  return { x, y, low, high };
}

function drawChart(pane, chart, canvas) {
  const ctx = canvas.getContext("2d");
  const depth = pane.data.depth;
  const points = chartPoints(pane, chart);
  const reference = chartReference(pane, chart);
  const s = chartScale(pane, points, reference);
  ctx.clearRect(0, 0, CHART_W, CHART_H);
  // The chosen layer's column.
  const colW = (CHART_W - PAD.left - PAD.right) / depth;
  ctx.fillStyle = "rgba(255, 200, 0, 0.25)";
  ctx.fillRect(s.x(paneLayer(pane)) - colW / 2, PAD.top, colW, CHART_H - PAD.top - PAD.bottom);
  ctx.fillStyle = "#333";
  ctx.font = "10px sans-serif";
  // Enough digits that the two axis labels differ.
  const digits = Math.min(7, 3 + Math.max(0, Math.ceil(Math.log10(Math.abs(s.high) / (s.high - s.low)))));
  ctx.fillText(s.high.toPrecision(digits), 2, PAD.top + 8);
  ctx.fillText(s.low.toPrecision(digits), 2, CHART_H - PAD.bottom);
  for (let l = 0; l < depth; l += Math.ceil(depth / 12)) ctx.fillText(String(l), s.x(l) - 3, CHART_H - 6);
  if (reference !== null) {
    ctx.strokeStyle = "#999";
    ctx.setLineDash([4, 3]);
    line(ctx, PAD.left, s.y(reference), CHART_W - PAD.right, s.y(reference));
    ctx.setLineDash([]);
    const labelY = s.y(reference) < PAD.top + 12 ? s.y(reference) + 11 : s.y(reference) - 3;
    ctx.fillText(chart.refName, CHART_W - PAD.right - 30, labelY);
  }
  for (const p of points) {
    ctx.beginPath();
    ctx.arc(s.x(p.layer), s.y(p.y), p.size, 0, 2 * Math.PI);
    if (p.y === null) {
      ctx.strokeStyle = p.colour;
      ctx.stroke();
    } else {
      ctx.fillStyle = p.colour;
      ctx.fill();
    }
  }
  if (chart.key !== "norms" && state.head === "mean") {
    // The mean over heads, as a line.
    ctx.strokeStyle = "rgba(40, 90, 160, 0.9)";
    ctx.beginPath();
    let drawing = false;
    for (let l = 0; l < depth; l++) {
      // The mean over the heads where the statistic is defined; a gap where it is defined for none.
      const values = chartValues(pane, chart, l).filter((v) => v !== null);
      if (!values.length) {
        drawing = false;
        continue;
      }
      const mean = values.reduce((a, b) => a + b, 0) / values.length;
      if (drawing) ctx.lineTo(s.x(l), s.y(mean));
      else ctx.moveTo(s.x(l), s.y(mean));
      drawing = true;
    }
    ctx.stroke();
  }
}

function buildCharts(pane) {
  for (const chart of CHARTS) {
    const figure = document.createElement("figure");
    const canvas = document.createElement("canvas");
    canvas.width = CHART_W;
    canvas.height = CHART_H;
    canvas.className = `chart-${chart.key}`;
    const caption = document.createElement("figcaption");
    caption.textContent = `${chart.title}, by layer`;
    figure.append(caption, canvas);
    pane.el("charts").append(figure);
    // Hover: the nearest dot's numbers; click: choose that layer.
    canvas.addEventListener("mousemove", (event) => {
      const points = chartPoints(pane, chart);
      const s = chartScale(pane, points, chartReference(pane, chart));
      let best = null;
      let bestDistance = Infinity;
      for (const p of points) {
        const distance = Math.hypot(s.x(p.layer) - event.offsetX, s.y(p.y) - event.offsetY);
        if (distance < bestDistance) [best, bestDistance] = [p, distance];
      }
      pane.el("chart-readout").textContent = best && bestDistance < 12 ? best.label : "";
    });
    canvas.addEventListener("click", (event) => {
      const colW = (CHART_W - PAD.left - PAD.right) / pane.data.depth;
      const layer = Math.floor((event.offsetX - PAD.left) / colW);
      if (layer >= 0 && layer < pane.data.depth) update({ layer });
    });
  }
}

// ---- controls ----------------------------------------------------------------------------------------------

function fillSelect(select, options) {
  select.replaceChildren(
    ...options.map(([value, text]) => {
      const option = document.createElement("option");
      option.value = value;
      option.textContent = text;
      return option;
    }),
  );
}

// The class selector and each pane's prediction list, rebuilt only when the image changes (an element under the
// pointer stays the one that was there), the chosen class marked on every update.
let classesFor = null;
function fillClasses() {
  if (classesFor === state.image) {
    $("class-select").value = String(state.classRank);
    for (const pane of panes) {
      [...pane.el("predictions").children].forEach((item, rank) =>
        item.classList.toggle("chosen", rank === state.classRank && state.view === "relevance"));
    }
    return;
  }
  classesFor = state.image;
  const tops = panes.map((pane) => entries(pane.data.images[state.image]));
  const ranks = Math.min(...tops.map((top) => top.length));
  state.classRank = Math.max(0, Math.min(state.classRank, ranks - 1));
  fillSelect(
    $("class-select"),
    [...Array(ranks).keys()].map((rank) => [rank, tops.map((top) => className(top[rank])).join(" | ")]),
  );
  $("class-select").value = String(state.classRank);
  for (const pane of panes) {
    const page = pane.data.images[state.image];
    // A model without a classifier has no predictions: its list holds the target alone, under its own heading.
    pane.el("predictions-heading").textContent = page.top.length ? "Top predictions" : "Relevance target";
    pane.el("predictions-heading").hidden = !entries(page).length;
    pane.el("predictions").replaceChildren(
      ...entries(page).map((c, rank) => {
        const item = document.createElement("li");
        item.textContent = c.index === undefined
          ? `${className(c)}: ${c.score.toFixed(4)}`
          : `${className(c)}: ${(100 * c.probability).toFixed(1)} %, logit ${c.logit.toFixed(3)}`;
        item.title = "show the relevance for this entry";
        item.classList.toggle("chosen", rank === state.classRank && state.view === "relevance");
        item.addEventListener("click", () => update({ view: "relevance", classRank: Math.min(rank, ranks - 1) }));
        return item;
      }),
    );
  }
}

// Relevance needs an entry on every pane: a model without a classifier has one only where a target was given.
function relevanceShown() {
  return panes.every((pane) => entries(pane.data.images[state.image]).length > 0);
}

function update(changes) {
  Object.assign(state, changes);
  if (state.view === "relevance" && !relevanceShown()) state.view = "attention";
  $("image-select").value = String(state.image);
  $("view-select").value = state.view;
  $("layer-select").value = String(state.layer);
  $("head-select").value = String(state.head);
  $("layer-select").disabled = !["attention", "norms", "decomposition"].includes(state.view);
  $("head-select").disabled = !["attention", "dino", "decomposition"].includes(state.view);
  $("class-select").disabled = state.view !== "relevance";
  $("method-select").value = state.method;
  $("method-select").disabled = state.view !== "method";
  $("relevance-option").disabled = !relevanceShown();
  $("mask-toggle").checked = state.mask;
  $("shared-scale").checked = state.shared;
  fillClasses();
  const rows = panes.map((pane) => (state.view === "pca" ? null : currentRow(pane)));
  panes.forEach((pane, i) => {
    pane.el("colour-scale").style.display = state.view === "pca" ? "none" : "";
    pane.el("left-out").textContent = pane.data.left_out.join("; ");
    if (state.view === "pca") {
      drawPca(pane);
    } else {
      drawImage(pane, rows[i], rows[i] === null ? 0 : scaleTop(pane, rows[i], rows));
      drawReadout(pane, rows[i]);
    }
  });
  for (const pane of panes) {
    drawDecomposition(pane);
    drawTokenChart(pane);
    CHARTS.forEach((chart) => drawChart(pane, chart, pane.el(`chart-${chart.key}`)));
    pane.el("chart-note").textContent = undefinedDistances(pane);
  }
}

// The heads of this image whose mean attention distance is undefined, named (hollow red dots in the chart).
function undefinedDistances(pane) {
  const heads = [];
  pane.data.images[state.image].stats.distance.forEach((values, l) =>
    values.forEach((v, h) => v === null && heads.push(`layer ${l} head ${h}`)),
  );
  return heads.length ? `mean attention distance ${NOT_DEFINED}, patch mass 0: ${heads.join(", ")}` : "";
}

// The point of the picture under the pointer, as fractions of its height and width (null: outside).
function pointAt(event) {
  const canvas = event.currentTarget;
  const y = event.offsetY / canvas.clientHeight;
  const x = event.offsetX / canvas.clientWidth;
  if (x < 0 || x >= 1 || y < 0 || y >= 1) return null;
  return { point: [y, x] };
}

function wirePane(pane) {
  const canvas = pane.el("image-canvas");
  canvas.addEventListener("mousemove", (e) => update({ hover: pointAt(e) }));
  canvas.addEventListener("mouseleave", () => update({ hover: null }));
  canvas.addEventListener("click", (e) => {
    const where = pointAt(e);
    // The centre of the clicked patch, so that the other pane finds the patch under that centre.
    if (where !== null) {
      const [y, x] = where.point;
      const centre = [(Math.floor(y * pane.GH) + 0.5) / pane.GH, (Math.floor(x * pane.GW) + 0.5) / pane.GW];
      update({ query: { point: centre } });
    }
  });
  const list = pane.el("prefix-tokens");
  pane.prefix.forEach((name, t) => {
    const item = document.createElement("li");
    item.dataset.token = String(t);
    item.dataset.name = name;
    item.title = `the ${prefixLabel(name)}: click to make it the query`;
    item.addEventListener("click", () => update({ query: { prefix: name } }));
    item.addEventListener("mouseenter", () => update({ hover: { prefix: name } }));
    item.addEventListener("mouseleave", () => update({ hover: null }));
    list.append(item);
  });
}

function wireControls() {
  const depth = Math.max(...panes.map((pane) => pane.data.depth));
  const heads = Math.max(...panes.map((pane) => pane.data.heads));
  fillSelect($("image-select"), DATA.titles.map((title, i) => [i, `${i}: ${title}`]));
  fillSelect($("layer-select"), [...Array(depth).keys()].map((l) => [l, `layer ${l}`]));
  fillSelect($("head-select"), [["mean", "mean of heads"], ...[...Array(heads).keys()].map((h) => [h, `head ${h}`])]);
  // Every method any pane holds, by name, labelled with its parameters (the same in every pane).
  const methods = new Map(panes.flatMap((pane) => pane.data.methods.map((m) => [m.name, m.label])));
  fillSelect($("method-select"), [...methods]);
  state.method = methods.keys().next().value;
  // The gradient methods a pane could not compute (no classifier, no target): listed, disabled, saying why.
  panes.map((pane) => pane.data.methods_note).filter((note) => note).slice(0, 1).forEach((note) => {
    const option = document.createElement("option");
    option.disabled = true;
    option.textContent = note;
    $("method-select").append(option);
  });
  // The decomposition needs a score (a class or a target): where no pane has one, it is not offered, and says why.
  if (panes.every((pane) => pane.data.decomposition_note)) {
    $("decomposition-option").disabled = true;
    $("decomposition-option").textContent += ` (none: ${panes[0].data.decomposition_note})`;
  }
  // DINO's view reads the class token's attention: where no pane has one, it is not offered, and says why.
  if (!panes.some((pane) => pane.prefix.includes("cls"))) {
    $("dino-option").disabled = true;
    $("dino-option").textContent += " (none: this model has no class token)";
  }
  $("method-select").addEventListener("change", (e) => update({ view: "method", method: e.target.value }));
  $("image-select").addEventListener("change", (e) => update({ image: Number(e.target.value), classRank: 0 }));
  $("view-select").addEventListener("change", (e) => update({ view: e.target.value }));
  $("layer-select").addEventListener("change", (e) => update({ layer: Number(e.target.value) }));
  $("head-select").addEventListener("change", (e) =>
    update({ head: e.target.value === "mean" ? "mean" : Number(e.target.value) }));
  $("class-select").addEventListener("change", (e) => update({ classRank: Number(e.target.value) }));
  $("mask-toggle").addEventListener("change", (e) => update({ mask: e.target.checked }));
  $("shared-scale").addEventListener("change", (e) => update({ shared: e.target.checked }));
  $("shared-scale-label").hidden = panes.length < 2;
  $("opacity").addEventListener("input", (e) => update({ opacity: Number(e.target.value) / 100 }));
  panes.forEach(wirePane);
}

function paneLine(pane) {
  const d = pane.data;
  const [ph, pw] = d.patch;
  const prefix = pane.P
    ? `${pane.P} prefix token${pane.P > 1 ? "s" : ""} (${pane.prefix.join(", ")}, tokens 0..${pane.P - 1}) then`
    : "no prefix tokens, only";
  return (
    `${d.depth} layers × ${d.heads} heads · ${pane.GH}×${pane.GW} patches of ${ph}×${pw} px on a ` +
    `${d.input_size[0]}×${d.input_size[1]} input · ${pane.N} tokens: ${prefix} the patches, patch (row r, col c) ` +
    `is token ${pane.P} + r·${pane.GW} + c.`
  );
}

// Where two models differ in what the shared controls select.
function compareLine() {
  if (panes.length < 2) return "";
  const [a, b] = panes.map((pane) => pane.data);
  const differ = [];
  const each = (what, f) => f(a) !== f(b) && differ.push(`${what} ${f(a)} vs ${f(b)}`);
  each("layers", (d) => d.depth);
  each("heads", (d) => d.heads);
  each("patch grid", (d) => d.layout.grid.join("×"));
  each("patch size", (d) => d.patch.join("×"));
  each("input size", (d) => d.input_size.join("×"));
  each("input channels", (d) => d.in_channels);
  each("prefix tokens", (d) => d.layout.prefix.join(", ") || "none");
  if (!differ.length) return "The two models have the same layout: every selection applies to both.";
  const notes = [`The two models differ: ${differ.join("; ")}.`];
  if (a.depth !== b.depth || a.heads !== b.heads) {
    notes.push("The layer and head selectors run to the larger; a model past its last layer or head shows its " +
      "last, and says so above its map.");
  }
  notes.push("A clicked patch is found in each model by its place in the picture, a prefix token by its name.");
  return notes.join(" ");
}

function describe() {
  $("model-line").textContent =
    "Layers, heads and tokens are numbered from 0. Click a patch (or a prefix token beside the map) to make it " +
    "the query; hover to read a key's weight." +
    (panes.length > 1 ? " One set of controls drives both models, on the same image." : "");
  $("compare-line").textContent = compareLine();
  for (const pane of panes) {
    pane.el("pane-name").textContent = pane.data.name;
    pane.el("pane-line").textContent = paneLine(pane);
  }
  $("precision").textContent =
    `Stated precision. Attention weights are stored as ${DATA.attention_bits}-bit integers scaled by each row's ` +
    `maximum: each weight ` +
    `is within ± (row maximum)/${2 * DATA.attention_levels} of the recorded A, the bound printed beside it ` +
    `(for the mean of heads, the mean of the heads' bounds, or where the page stores the mean of heads as its own ` +
    `row, that row's own bound). Rollout and relevance are stored as float16 ` +
    `(relative error ≤ 2^-11, plus 2^-25 of the matrix scale for tiny values); token norms to 4 decimals. ` +
    `Every "±" printed on this page includes the rounding of the printed digits. ` +
    `Relevance: Chefer, Gur and Wolf (2021), R = I; R ← R + mean_h((∂y_c/∂A ⊙ A)⁺) R over the layers; ` +
    (panes.some((pane) => pane.data.classifier)
      ? "y_c is the logit of the chosen class, or the chosen target's score (a cosine similarity). "
      : "y_c is the chosen target's score (a cosine similarity; this model has no classifier). ") +
    `Rollout: Abnar and Zuidema (2020), ${methodLabel("rollout")}; relevance: ${methodLabel("relevance")}. ` +
    `Both draw the query's row of R (until a patch is clicked, the class token's, or the centre patch's for a ` +
    `model without one), named above. Patch similarity: the cosine of each final token (forward_features, ` +
    `stored as float16) to the query's, within ± ${DATA.cosine_bound.toPrecision(3)}. ` +
    `Mean attention distance: over patch-to-patch attention, weighted by the mass it gets; ${NOT_DEFINED} ` +
    `where a head's patches put no weight on patches. DINO's view (Caron et al. 2021): the last layer's ` +
    `class-token attention over the patches, per head, normalised to sum 1; the mask keeps the highest patches ` +
    `whose mass adds to 60% (sorted ascending, the patches where the cumulative sum exceeds 0.4), computed from ` +
    `the recorded attention before it was stored. Patch PCA (Oquab et al. 2024): one PCA per model, fitted on ` +
    `that model's own last-layer normed patch tokens of all the images (prefix tokens dropped), signs by ` +
    `scikit-learn's rule; components 0..2 as red, green, blue, each min-max scaled, stored as round(255 c) ` +
    `(within 1/510 of the colour). Explanation methods (vit_einops.inspect.METHODS): each map on the patch grid ` +
    `as that method computes it, named with its parameters, stored as float16 like rollout; the gradient methods ` +
    `explain the target where one was given, else the top class. Decomposition (Elhage et al. 2021; Gandelsman ` +
    `et al. 2024): that same score split exactly into each head's and MLP's direct share and the rest (the final ` +
    `norm's scale, the output's norm and an attention pool's weights at their observed values), stored as the ` +
    `float32 numbers; each head's share by source token stored as float16 like the methods' maps; the lens strip ` +
    `is the score with the final norm and head applied to the residual stream after each layer.`;
}

// A method's label (its name and parameters) as the first pane holding it computed it.
function methodLabel(name) {
  const method = panes.flatMap((pane) => pane.data.methods).find((m) => m.name === name);
  return method ? method.label : name;
}

// What a pane's gradient methods explain: the page's target, or each image's top class.
function explained(pane) {
  const page = pane.data.images[state.image];
  if (page.target) return className(page.target);
  return page.top.length ? `the top class, ${className(page.top[0])}` : "nothing";
}

async function main() {
  try {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream; open the page in a current Chrome, Firefox or Safari");
    }
    DATA.panes.forEach((data, i) => panes.push(makePane(data, i)));
    for (const pane of panes) {
      for (const page of pane.data.images) pane.decoded.push(await decodeImage(page, pane.data.token_dim));
    }
    describe();
    wireControls();
    panes.forEach(buildCharts);
    update({});
    document.body.dataset.ready = "true";
  } catch (err) {
    $("error").textContent = `The explorer could not start: ${err.message}`;
    throw err;
  }
}

main();
