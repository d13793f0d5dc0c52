"""The thread policy of every command (vit_einops.base.threads): the free cores on a scripted /proc/stat, followed
while the work runs, fixed by --threads or VIT_EINOPS_THREADS (checked), printed by each command, and torch's count
put back afterwards. No timing here: every reading of the machine is scripted."""

from __future__ import annotations

import os

import pytest
import torch

from test_bench_noise import TICKS, proc_stat
from vit_einops.base import threads
from vit_einops.base.threads import ENV_VAR, LoadProbe, ThreadPolicy, fixed_threads, follow_free_cores, thread_policy
from vit_einops.commands.cli import main
from vit_einops.modelfile import save_vit

from _tiny import model_flags, tiny_vit


class Machine:
    """A scripted 2-CPU machine: each reading of the clock moves it on ``step_s`` seconds, during which the other
    processes use ``others`` cores (this process none); /proc/stat shows their busy ticks so far."""

    def __init__(self, others: float = 0.0, step_s: float = 2.0, ends_at: float = float("inf")):
        """``ends_at``: the other processes end then (their cores free from that clock time on)."""
        self.others, self.step_s, self.now, self.busy, self.ends_at = others, step_s, 0.0, 0.0, ends_at

    def clock(self) -> float:
        self.now += self.step_s
        self.busy += self.others * self.step_s * (self.now <= self.ends_at)
        return self.now

    def probe(self) -> LoadProbe:
        return LoadProbe(read_stat=lambda: proc_stat(round(self.busy * TICKS)), own_cpu_s=lambda: 0.0,
                         load=lambda: 9.0, clock=self.clock, ticks_per_s=TICKS, cpu_count=2)  # fmt: skip


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.delenv(ENV_VAR)


def test_the_policy_follows_the_free_cores_while_the_work_runs(two_cpus):
    """One core busy at the start: 1 thread; the other process ends: 2; it comes back: 1 again."""
    machine = Machine(1.0)
    policy = ThreadPolicy(probe=machine.probe(), sleep=lambda s: pytest.fail("no window left to wait"))
    used = []
    for others in (1.0, 0.02, 1.1):
        machine.others = others
        used.append(policy.follow())
    assert used == [1, 2, 1] and torch.get_num_threads() == 1 and policy.used == [1, 2, 1]
    assert policy.describe() == (
        f"threads: 1, then 2, then 1 (followed the free cores; at the last check 1 of 2 cores busy with other "
        f"processes; --threads or {ENV_VAR} fixes it)"
    )


def test_the_first_choice_describes_the_busy_cores(two_cpus):
    policy = ThreadPolicy(probe=Machine(1.0).probe(), sleep=lambda s: None)
    assert policy.follow() == 1
    assert policy.describe() == f"threads: 1 (1 of 2 cores busy with other processes; --threads or {ENV_VAR} fixes it)"
    idle = ThreadPolicy(probe=Machine(0.0).probe(), sleep=lambda s: None)
    assert idle.follow() == 2 and idle.describe().startswith("threads: 2 (all 2 cores free;")


def test_without_proc_stat_the_load_average_makes_the_first_choice_only(two_cpus):
    """The load average counts this process's own threads once they run: read at the start only."""
    machine = Machine()
    probe = machine.probe()
    probe.read_stat = lambda: (_ for _ in ()).throw(OSError("no /proc"))
    loads = iter([0.3, 0.3, 5.0, 5.0])  # the policy's start, its first choice, the next check
    probe.load = lambda: next(loads)
    policy = ThreadPolicy(probe=probe, sleep=lambda s: None)
    assert [policy.follow(), policy.follow()] == [2, 2]
    assert policy.describe().startswith("threads: 2 (")


def test_a_check_within_a_second_reads_nothing(two_cpus):
    """The re-check is cheap: within RECHECK_S of the last one, no /proc/stat is read."""
    machine = Machine(1.0, step_s=0.2)
    probe = machine.probe()
    policy = ThreadPolicy(probe=probe, sleep=lambda s: None)
    assert policy.follow() == 1  # the first choice
    probe.read_stat = lambda: pytest.fail("read /proc/stat within a second of the last check")
    assert policy.follow() == 1


def test_the_first_choice_waits_out_the_window(two_cpus):
    waited = []
    policy = ThreadPolicy(probe=Machine(step_s=0.1).probe(), sleep=waited.append, window_s=0.3)
    policy.follow()
    assert waited == [pytest.approx(0.1)]  # the start at 0.1 s, the clock read at 0.2, the sample at 0.3 s


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", f"{ENV_VAR} 0 is out of range: expected 1 to 2 (this machine's CPUs)"),
        ("3", f"{ENV_VAR} 3 is out of range: expected 1 to 2 (this machine's CPUs)"),
        ("two", f"{ENV_VAR} must be a whole number of threads from 1 to 2, got 'two'"),
        ("1.5", f"{ENV_VAR} must be a whole number of threads from 1 to 2, got '1.5'"),
    ],
)
def test_the_variable_is_checked(two_cpus, monkeypatch, value, message):
    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(ValueError) as error:
        fixed_threads(None)
    assert str(error.value) == message


def test_the_flag_wins_over_the_variable(two_cpus, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")
    assert fixed_threads(2) == (2, "--threads") and fixed_threads(None) == (1, ENV_VAR)
    monkeypatch.setenv(ENV_VAR, " ")
    assert fixed_threads(None) == (None, "")


def test_in_python_the_policy_chooses_on_entry(two_cpus, monkeypatch):
    import vit_einops

    monkeypatch.setattr(threads, "LoadProbe", Machine(1.0).probe)
    with vit_einops.thread_policy() as policy:
        assert torch.get_num_threads() == 1 and policy.used == [1]


def test_the_policy_puts_torchs_count_back_and_changes_nothing_outside(two_cpus):
    before = torch.get_num_threads()
    assert follow_free_cores() == before  # no policy: library code leaves torch's count alone
    with thread_policy(1) as policy:
        assert torch.get_num_threads() == 1 and follow_free_cores() == 1
        assert policy.describe() == "threads: 1 (--threads)"
    assert torch.get_num_threads() == before


@pytest.fixture
def digits_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_vit(tiny_vit(), path)
    return path


FAITHFULNESS = ["--num-images", "2", "--methods", "rollout", "--steps", "2", "--no-progress", "--out", "scores"]


def run(capsys, *argv):
    before = torch.get_num_threads()
    code = main(list(argv))
    assert torch.get_num_threads() == before  # put back: the command ran in this process
    return code, capsys.readouterr()


def test_faithfulness_prints_its_threads(digits_file, capsys):
    code, out = run(capsys, "faithfulness", str(digits_file), *FAITHFULNESS, "--threads", "1")
    assert code == 0 and "images, threads: 1 (--threads); written to scores" in out.out
    code, out = run(capsys, "faithfulness", str(digits_file), *FAITHFULNESS, "--force")
    assert code == 0 and f"threads: 1 ({ENV_VAR})" in out.out


def test_faithfulness_follows_the_free_cores_by_default(digits_file, capsys, two_cpus, monkeypatch):
    monkeypatch.setattr(threads, "LoadProbe", Machine(1.0).probe)
    code, out = run(capsys, "faithfulness", str(digits_file), *FAITHFULNESS)
    assert code == 0
    assert f"threads: 1 (1 of 2 cores busy with other processes; --threads or {ENV_VAR} fixes it)" in out.out


def test_faithfulness_follows_the_cores_while_it_runs(digits_file, capsys, two_cpus, monkeypatch):
    """Another process ends during the run: the next check between chunks takes its core."""
    monkeypatch.setattr(threads, "LoadProbe", Machine(1.0, ends_at=8.0).probe)
    code, out = run(capsys, "faithfulness", str(digits_file), *FAITHFULNESS)
    assert code == 0
    assert (f"threads: 1, then 2 (followed the free cores; at the last check all 2 cores free; --threads or {ENV_VAR} "
            "fixes it)") in out.out  # fmt: skip


def test_train_follows_the_free_cores_by_default(tmp_path, capsys, two_cpus, monkeypatch):
    """train chooses its count as every command does (docs/training.md says so): from the free cores, not a fixed
    one thread, and its last line says which and why."""
    monkeypatch.setattr(threads, "LoadProbe", Machine(1.0).probe)
    out = tmp_path / "run"
    code, printed = run(capsys, "train", "--limit", "96", "--epochs", "1", "--out", str(out), "--no-progress",
                        *model_flags())  # fmt: skip
    assert code == 0
    last = printed.out.splitlines()[-1]
    assert last.endswith(f"; threads: 1 (1 of 2 cores busy with other processes; --threads or {ENV_VAR} fixes it)")


def test_inspect_prints_its_threads(digits_file, capsys, unrendered):
    code, out = run(capsys, "inspect", str(digits_file), "--num-images", "1", "--distance-images", "2",
                    "--out", "report", "--threads", "1")  # fmt: skip
    assert code == 0 and out.out.splitlines()[-1] == "threads: 1 (--threads)"


@pytest.mark.parametrize(
    "flag, message",
    [
        ("0", "argument --threads: threads 0 is out of range: expected 1 to {cpus} (this machine's CPUs)"),
        ("100000", "argument --threads: threads 100000 is out of range: expected 1 to {cpus} (this machine's CPUs)"),
        ("x", "argument --threads: expected a whole number, got 'x'"),
    ],
)
@pytest.mark.parametrize("command", ["faithfulness", "inspect"])
def test_bad_threads_are_refused_by_name(digits_file, capsys, command, flag, message):
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(digits_file), "--out", "o", "--threads", flag])
    assert exit_info.value.code == 2
    assert message.format(cpus=os.cpu_count()) in capsys.readouterr().err


def test_a_bad_variable_is_one_line_naming_it(digits_file, capsys, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "-1")
    code, out = run(capsys, "inspect", str(digits_file), "--out", "o")
    assert code == 2
    assert out.err == f"vit-einops inspect: error: {ENV_VAR} -1 is out of range: expected 1 to {os.cpu_count()} " \
        "(this machine's CPUs)\n"
