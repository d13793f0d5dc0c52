// The attention explorer. Everything it draws comes from the JSON in #explorer-data, written by
// vit_einops.explore (see payload.py there for how the arrays are stored and how precise they are).
//
// Numbering, as in the rest of vit-einops: layers, heads, tokens and classes count from 0. Token 0 is the
// class token; patch (row r, col c) of a gh x gw grid is token 1 + r * gw + c.
"use strict";

const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
const N = DATA.tokens;
const [GH, GW] = DATA.grid;

// What is shown: the whole page is redrawn from this object whenever it changes.
const state = {
  image: 0,
  view: "attention", // attention | rollout | relevance | norms
  layer: 0,
  head: "mean", // "mean" or a head index
  classRank: 0, // which of the image's top classes the relevance is for
  query: 0, // the token whose row is drawn (0 = class token)
  opacity: 0.6, // of the heat map over the picture
  hoverKey: null, // the token under the pointer
};

const decoded = []; // per image: {attention, rowmax, rollout, relevance[], picture}
const $ = (id) => document.getElementById(id);

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

async function decodeImage(page) {
  return {
    attention: await inflate(page.attention), // uint8 codes (layer, head, query, key)
    rowmax: float32Array(await inflate(page.attention_rowmax)), // (layer, head, query)
    rollout: halfMatrix(await inflate(page.rollout), page.rollout_scale), // (query, key)
    rolloutScale: page.rollout_scale,
    relevance: await Promise.all(page.top.map(async (c) => halfMatrix(await inflate(c.relevance), c.relevance_scale))),
    picture: await loadPicture(page.png),
  };
}

// ---- the row being drawn: values over all N keys, and each value's error bound ------------------------

// Row `query` of the selected matrix: {values, bounds, name}. bounds[j] is how far values[j] may be from the
// number the model computed (the quantisation of the stored arrays, see the footer).
function currentRow() {
  const d = decoded[state.image];
  const page = DATA.images[state.image];
  const values = new Float64Array(N);
  const bounds = new Float64Array(N);
  if (state.view === "attention") {
    const heads = state.head === "mean" ? [...Array(DATA.heads).keys()] : [state.head];
    for (const h of heads) {
      const rowIndex = (state.layer * DATA.heads + h) * N + state.query;
      const step = d.rowmax[rowIndex] / DATA.attention_levels; // one uint8 step of this row
      for (let j = 0; j < N; j++) {
        values[j] += (d.attention[rowIndex * N + j] * step) / heads.length;
        bounds[j] += step / 2 / heads.length; // rounding to the nearest step: half a step
      }
    }
    const head = state.head === "mean" ? "mean of heads" : `head ${state.head}`;
    return { values, bounds, name: `attention A, layer ${state.layer}, ${head}`, digits: "fixed" };
  }
  if (state.view === "norms") {
    const norms = page.stats.norms[state.layer];
    for (let j = 0; j < N; j++) {
      values[j] = norms[j];
      bounds[j] = 5e-5; // stored rounded to 4 decimals
    }
    return { values, bounds, name: `token norm ||z||, after layer ${state.layer}`, digits: "significant" };
  }
  const matrix = state.view === "rollout" ? d.rollout : d.relevance[state.classRank];
  const scale = state.view === "rollout" ? page.rollout_scale : page.top[state.classRank].relevance_scale;
  for (let j = 0; j < N; j++) {
    values[j] = matrix[state.query * N + j];
    bounds[j] = Math.abs(values[j]) * DATA.half_relative + scale * DATA.half_subnormal;
  }
  const cls = page.top[state.classRank];
  const name = state.view === "rollout" ? "rollout R (all layers, mean of heads)" : `relevance R for ${className(cls)}`;
  return { values, bounds, name, digits: "significant" };
}

// A number and its bound as printed: the bound adds the printing's own rounding and is rounded up.
function formatValue(value, bound, digits) {
  const text = digits === "fixed" ? value.toFixed(6) : value.toPrecision(6);
  const printing = digits === "fixed" ? 5e-7 : 5e-6 * Math.abs(value);
  return `${text} ± ${((bound + printing) * 1.01).toPrecision(3)}`;
}

function className(c) {
  // c.name is class_name()'s: the recorded name, or "class i" where none is known.
  return c.name === `class ${c.index}` ? c.name : `${c.name} (class ${c.index})`;
}

function tokenName(token) {
  if (token === 0) return "token 0 (class token)";
  const p = token - 1;
  return `token ${token} (patch row ${Math.floor(p / GW)}, col ${p % GW})`;
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

function drawImage() {
  const canvas = $("image-canvas");
  const ctx = canvas.getContext("2d");
  const d = decoded[state.image];
  const row = currentRow();
  const cellW = canvas.width / GW;
  const cellH = canvas.height / GH;
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(d.picture, 0, 0, canvas.width, canvas.height);
  // Heat map over the patches, linear from 0 to this row's largest patch value (the class token is shown apart,
  // on the same scale, clipped).
  const peak = patchPeak(row);
  const scaled = (v) => (peak > 0 ? Math.min(Math.max(v / peak, 0), 1) : 0);
  for (let j = 1; j < N; j++) {
    const p = j - 1;
    ctx.fillStyle = colour(scaled(row.values[j]), state.opacity);
    ctx.fillRect((p % GW) * cellW, Math.floor(p / GW) * cellH, cellW, cellH);
  }
  // The patch grid.
  ctx.strokeStyle = "rgba(255, 255, 255, 0.35)";
  ctx.lineWidth = 1;
  for (let c = 1; c < GW; c++) line(ctx, c * cellW, 0, c * cellW, canvas.height);
  for (let r = 1; r < GH; r++) line(ctx, 0, r * cellH, canvas.width, r * cellH);
  // The query patch (dashed white) and the key under the pointer (solid red).
  if (state.view !== "norms" && state.query > 0) outline(ctx, state.query, cellW, cellH, "#fff", [5, 3]);
  if (state.hoverKey !== null && state.hoverKey > 0) outline(ctx, state.hoverKey, cellW, cellH, "#e22", []);
  const cls = $("class-token");
  cls.style.background = colour(scaled(row.values[0]), 0.8);
  cls.style.color = scaled(row.values[0]) > 0.6 ? "#000" : "#fff";
  cls.classList.toggle("query", state.query === 0 && state.view !== "norms");
  drawScale(row, peak);
}

// The largest value over the patches (tokens 1..N-1): the top of the colour scale.
function patchPeak(row) {
  let peak = 0;
  for (let j = 1; j < N; j++) peak = Math.max(peak, row.values[j]);
  return peak;
}

// The colour scale under the picture: its ramp and range, in every view. data-min / data-max hold the exact
// numbers (the text rounds them).
function drawScale(row, peak) {
  const bar = $("scale-bar");
  const ctx = bar.getContext("2d");
  for (let x = 0; x < bar.width; x++) {
    ctx.fillStyle = colour(x / (bar.width - 1), 1);
    ctx.fillRect(x, 0, 1, bar.height);
  }
  const box = $("colour-scale");
  box.dataset.min = "0";
  box.dataset.max = String(peak);
  $("scale-min").textContent = "0";
  $("scale-max").textContent = peak.toPrecision(4);
  const own = row.values[0];
  const clipped = peak > 0 && own > peak ? ", above the scale: drawn at its top" : "";
  $("scale-line").textContent =
    `colour: linear from 0 (dark blue) to ${peak.toPrecision(4)} (yellow), the largest value on a patch in ` +
    `this ${state.view === "norms" ? "layer" : "row"}; class token ${own.toPrecision(4)}${clipped}`;
}

function line(ctx, x0, y0, x1, y1) {
  ctx.beginPath();
  ctx.moveTo(x0, y0);
  ctx.lineTo(x1, y1);
  ctx.stroke();
}

function outline(ctx, token, cellW, cellH, style, dash) {
  const p = token - 1;
  ctx.save();
  ctx.strokeStyle = style;
  ctx.lineWidth = 2.5;
  ctx.setLineDash(dash);
  ctx.strokeRect((p % GW) * cellW + 1, Math.floor(p / GW) * cellH + 1, cellW - 2, cellH - 2);
  ctx.restore();
}

// Which row is drawn, said the same way in the line under the picture and in the footer.
function rowName(row) {
  if (state.view === "norms") return `${row.name} (every token's own norm: no query row)`;
  return `${row.name}, row ${state.query}: query ${tokenName(state.query)}`;
}

function drawLegend() {
  const q = state.query;
  $("legend-query").textContent =
    state.view === "norms"
      ? "query (dashed white box): none, token norms have no query"
      : `query (dashed white box${q === 0 ? "; for the class token, the dashed box above" : ""}): ${tokenName(q)}`;
  $("legend-hover").textContent =
    `hovered key (red box): ${state.hoverKey === null ? "none" : tokenName(state.hoverKey)}`;
  const head = state.head === "mean" ? "mean of heads (all blue)" : `head ${state.head}`;
  const used = { attention: "", rollout: "; the rollout uses every head", relevance: "; relevance uses every head",
    norms: "; token norms have no heads" }[state.view];
  $("legend-head").textContent = `selected head (charts: blue dots, the others grey): ${head}${used}`;
  const layers = ["rollout", "relevance"].includes(state.view) ? `; the ${state.view} combines every layer` : "";
  $("legend-layer").textContent = `selected layer (yellow column in the charts): layer ${state.layer}${layers}`;
}

// Why a map looks the way it does, where that is not its data's fault: identity relevance, a row with nothing
// on the patches, and which row of R is the usual one.
function viewNote(row) {
  const notes = [];
  const cls = DATA.images[state.image].top[state.classRank];
  if (state.view === "relevance" && cls.relevance_identity) {
    notes.push(
      "Relevance is the identity matrix for this class: no head's gradient-weighted attention " +
        "(∂y/∂A ⊙ A)⁺ is positive, so every row holds its own token alone and the patches get 0. The class's " +
        "logit does not depend on the attention: a zero-initialised classification head (a new or reset " +
        "classifier, as the paper initialises it) gives ∂y/∂A = 0.",
    );
  } else if (state.view !== "norms" && patchPeak(row) <= 0) {
    notes.push("This row puts no weight on any patch (all of it on the class token), so the map is blank.");
  }
  if (["rollout", "relevance"].includes(state.view) && state.query !== 0) {
    notes.push(`Shown: row ${state.query}, the clicked patch's. Row 0 (the class token's, what the classifier ` +
      "reads) is the usual map: click the class token to show it.");
  }
  return notes.join(" ");
}

function drawReadout() {
  const row = currentRow();
  $("query-line").textContent = rowName(row);
  $("footer-row").textContent = `Drawn over the patches: ${rowName(row)}.`;
  $("view-note").textContent = viewNote(row);
  drawLegend();
  if (state.hoverKey === null) {
    $("readout").textContent = "move the pointer over a patch (or the class token)";
    return;
  }
  const key = state.hoverKey;
  const what = { attention: "weight", rollout: "weight", relevance: "relevance", norms: "norm" }[state.view];
  const query = state.view === "norms" ? "" : `query ${state.query} · `;
  $("readout").textContent =
    `${query}key ${key} · ${what} ${formatValue(row.values[key], row.bounds[key], row.digits)} · ${tokenName(key)}`;
}

// ---- charts: one small scatter per statistic, x = layer, one dot per head ------------------------------------

const CHARTS = [
  { key: "distance", title: "mean attention distance (px)", reference: DATA.uniform_distance, refName: "uniform" },
  { key: "entropy", title: "attention entropy (nats)", reference: DATA.uniform_entropy, refName: "log n" },
  { key: "class_share", title: "share of attention on the class token", reference: 1 / N, refName: "1/n" },
  { key: "norms", title: "token norms (red: class token)", reference: null },
];
// The mean attention distance of a head whose patches attend only to the class token (no attention between
// patches: patch mass 0) is undefined.
const NOT_DEFINED = "n/a (attends only to the class token)";
const CHART_W = 300;
const CHART_H = 150;
const PAD = { left: 52, right: 8, top: 8, bottom: 20 };

function chartPoints(chart) {
  // [{layer, y, label, highlight, colour}] for the current image.
  const stats = DATA.images[state.image].stats;
  const points = [];
  for (let l = 0; l < DATA.depth; l++) {
    const values = stats[chart.key][l];
    values.forEach((y, i) => {
      if (chart.key === "norms") {
        const isQuery = i === state.query;
        points.push({ layer: l, y, label: `layer ${l}, ${tokenName(i)}: norm ${y.toFixed(4)}`,
          colour: i === 0 ? "#d22" : isQuery ? "#000" : "rgba(40, 90, 160, 0.35)", size: isQuery || i === 0 ? 3 : 1.6 });
      } else if (y === null) {
        // Undefined (payload.py writes null): drawn hollow on the bottom edge.
        points.push({ layer: l, y: null, label: `layer ${l}, head ${i}: ${NOT_DEFINED}`, colour: "#b00", size: 3 });
      } else {
        const chosen = state.head === "mean" || state.head === i;
        points.push({ layer: l, y, label: `layer ${l}, head ${i}: ${y.toFixed(4)}`,
          colour: chosen ? "rgba(40, 90, 160, 0.9)" : "rgba(150, 150, 150, 0.5)", size: chosen ? 2.6 : 2 });
      }
    });
  }
  return points;
}

function chartScale(points, reference) {
  const ys = points.filter((p) => p.y !== null).map((p) => p.y);
  let low = ys.length ? Math.min(...ys) : 0;
  let high = ys.length ? Math.max(...ys) : 1;
  if (reference !== null) {
    low = Math.min(low, reference);
    high = Math.max(high, reference);
  }
  if (high - low < 1e-12) high = low + 1;
  const x = (layer) => PAD.left + ((layer + 0.5) / DATA.depth) * (CHART_W - PAD.left - PAD.right);
  const plotH = CHART_H - PAD.top - PAD.bottom;
  const y = (v) => CHART_H - PAD.bottom - (v === null ? 0 : ((v - low) / (high - low)) * plotH);
  return { x, y, low, high };
}

function drawChart(chart, canvas) {
  const ctx = canvas.getContext("2d");
  const points = chartPoints(chart);
  const s = chartScale(points, chart.reference);
  ctx.clearRect(0, 0, CHART_W, CHART_H);
  // The chosen layer's column.
  const colW = (CHART_W - PAD.left - PAD.right) / DATA.depth;
  ctx.fillStyle = "rgba(255, 200, 0, 0.25)";
  ctx.fillRect(s.x(state.layer) - colW / 2, PAD.top, colW, CHART_H - PAD.top - PAD.bottom);
  ctx.fillStyle = "#333";
  ctx.font = "10px sans-serif";
  // Enough digits that the two axis labels differ.
  const digits = Math.min(7, 3 + Math.max(0, Math.ceil(Math.log10(Math.abs(s.high) / (s.high - s.low)))));
  ctx.fillText(s.high.toPrecision(digits), 2, PAD.top + 8);
  ctx.fillText(s.low.toPrecision(digits), 2, CHART_H - PAD.bottom);
  for (let l = 0; l < DATA.depth; l += Math.ceil(DATA.depth / 12)) ctx.fillText(String(l), s.x(l) - 3, CHART_H - 6);
  if (chart.reference !== null) {
    ctx.strokeStyle = "#999";
    ctx.setLineDash([4, 3]);
    line(ctx, PAD.left, s.y(chart.reference), CHART_W - PAD.right, s.y(chart.reference));
    ctx.setLineDash([]);
    const labelY = s.y(chart.reference) < PAD.top + 12 ? s.y(chart.reference) + 11 : s.y(chart.reference) - 3;
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
    for (let l = 0; l < DATA.depth; l++) {
      // The mean over the heads where the statistic is defined; a gap where it is defined for none.
      const values = DATA.images[state.image].stats[chart.key][l].filter((v) => v !== null);
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

function buildCharts() {
  for (const chart of CHARTS) {
    const figure = document.createElement("figure");
    const canvas = document.createElement("canvas");
    canvas.width = CHART_W;
    canvas.height = CHART_H;
    canvas.id = `chart-${chart.key}`;
    const caption = document.createElement("figcaption");
    caption.textContent = `${chart.title}, by layer`;
    figure.append(caption, canvas);
    $("charts").append(figure);
    // Hover: the nearest dot's numbers; click: choose that layer.
    canvas.addEventListener("mousemove", (event) => {
      const points = chartPoints(chart);
      const s = chartScale(points, chart.reference);
      let best = null;
      let bestDistance = Infinity;
      for (const p of points) {
        const distance = Math.hypot(s.x(p.layer) - event.offsetX, s.y(p.y) - event.offsetY);
        if (distance < bestDistance) [best, bestDistance] = [p, distance];
      }
      $("chart-readout").textContent = best && bestDistance < 12 ? best.label : "";
    });
    canvas.addEventListener("click", (event) => {
      const colW = (CHART_W - PAD.left - PAD.right) / DATA.depth;
      const layer = Math.floor((event.offsetX - PAD.left) / colW);
      if (layer >= 0 && layer < DATA.depth) update({ layer });
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

function fillClasses() {
  const top = DATA.images[state.image].top;
  fillSelect($("class-select"), top.map((c, rank) => [rank, className(c)]));
  $("class-select").value = String(state.classRank);
  const list = $("predictions");
  list.replaceChildren(
    ...top.map((c, rank) => {
      const item = document.createElement("li");
      item.textContent = `${className(c)}: ${(100 * c.probability).toFixed(1)} %, logit ${c.logit.toFixed(3)}`;
      item.title = "show the relevance for this class";
      item.classList.toggle("chosen", rank === state.classRank && state.view === "relevance");
      item.addEventListener("click", () => update({ view: "relevance", classRank: rank }));
      return item;
    }),
  );
}

function update(changes) {
  Object.assign(state, changes);
  $("image-select").value = String(state.image);
  $("view-select").value = state.view;
  $("layer-select").value = String(state.layer);
  $("head-select").value = String(state.head);
  $("layer-select").disabled = !["attention", "norms"].includes(state.view);
  $("head-select").disabled = state.view !== "attention";
  $("class-select").disabled = state.view !== "relevance";
  fillClasses();
  drawImage();
  drawReadout();
  CHARTS.forEach((chart) => drawChart(chart, $(`chart-${chart.key}`)));
  $("chart-note").textContent = undefinedDistances();
}

// The heads of this image whose mean attention distance is undefined, named (hollow red dots in the chart).
function undefinedDistances() {
  const heads = [];
  DATA.images[state.image].stats.distance.forEach((values, l) =>
    values.forEach((v, h) => v === null && heads.push(`layer ${l} head ${h}`)),
  );
  return heads.length ? `mean attention distance ${NOT_DEFINED}, patch mass 0: ${heads.join(", ")}` : "";
}

function keyAt(event) {
  const canvas = $("image-canvas");
  const col = Math.floor((event.offsetX / canvas.clientWidth) * GW);
  const row = Math.floor((event.offsetY / canvas.clientHeight) * GH);
  if (col < 0 || col >= GW || row < 0 || row >= GH) return null;
  return 1 + row * GW + col;
}

function wireControls() {
  fillSelect($("image-select"), DATA.images.map((page, i) => [i, `${i}: ${page.title}`]));
  fillSelect($("layer-select"), [...Array(DATA.depth).keys()].map((l) => [l, `layer ${l}`]));
  fillSelect($("head-select"), [["mean", "mean of heads"], ...[...Array(DATA.heads).keys()].map((h) => [h, `head ${h}`])]);
  $("image-select").addEventListener("change", (e) => update({ image: Number(e.target.value), classRank: 0 }));
  $("view-select").addEventListener("change", (e) => update({ view: e.target.value }));
  $("layer-select").addEventListener("change", (e) => update({ layer: Number(e.target.value) }));
  $("head-select").addEventListener("change", (e) =>
    update({ head: e.target.value === "mean" ? "mean" : Number(e.target.value) }));
  $("class-select").addEventListener("change", (e) => update({ classRank: Number(e.target.value) }));
  $("opacity").addEventListener("input", (e) => update({ opacity: Number(e.target.value) / 100 }));
  const canvas = $("image-canvas");
  canvas.addEventListener("mousemove", (e) => update({ hoverKey: keyAt(e) }));
  canvas.addEventListener("mouseleave", () => update({ hoverKey: null }));
  canvas.addEventListener("click", (e) => {
    const key = keyAt(e);
    if (key !== null) update({ query: key });
  });
  const cls = $("class-token");
  cls.addEventListener("click", () => update({ query: 0 }));
  cls.addEventListener("mouseenter", () => update({ hoverKey: 0 }));
  cls.addEventListener("mouseleave", () => update({ hoverKey: null }));
}

function describe() {
  const [ph, pw] = DATA.patch;
  $("model-line").textContent =
    `${DATA.depth} layers × ${DATA.heads} heads · ${GH}×${GW} patches of ${ph}×${pw} px · ${N} tokens. ` +
    "Layers, heads and tokens are numbered from 0; token 0 is the class token, patch (row r, col c) is token " +
    `1 + r·${GW} + c. Click a patch (or the class token) to make it the query; hover to read a key's weight.`;
  $("precision").textContent =
    `Stated precision. Attention weights are stored as ${DATA.attention_bits}-bit integers scaled by each row's ` +
    `maximum: each weight ` +
    `is within ± (row maximum)/${2 * DATA.attention_levels} of the recorded A, the bound printed beside it ` +
    `(for the mean of heads, the mean of the heads' bounds). Rollout and relevance are stored as float16 ` +
    `(relative error ≤ 2^-11, plus 2^-25 of the matrix scale for tiny values); token norms to 4 decimals. ` +
    `Every "±" printed on this page includes the rounding of the printed digits. ` +
    `Relevance: Chefer, Gur and Wolf (2021), R = I; R ← R + mean_h((∂y_c/∂A ⊙ A)⁺) R over the layers; ` +
    `y_c is the logit of the chosen class. Rollout: Abnar and Zuidema (2020), residual 0.5, mean of heads. ` +
    `Both draw the query's row of R (row 0, the class token's, until a patch is clicked), named above. ` +
    `Mean attention distance: over patch-to-patch attention, weighted by the mass it gets; ${NOT_DEFINED} ` +
    `where a head's patches put no weight on patches.`;
}

async function main() {
  try {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream; open the page in a current Chrome, Firefox or Safari");
    }
    for (const page of DATA.images) decoded.push(await decodeImage(page));
    describe();
    wireControls();
    buildCharts();
    update({});
    document.body.dataset.ready = "true";
  } catch (err) {
    $("error").textContent = `The explorer could not start: ${err.message}`;
    throw err;
  }
}

main();
