"""What a run was doing when it was stopped or when its live report was written: a signal that
lands while the main thread is inside the runtime (a minutes-long XLA compile) is seen at once
by the watcher thread, not when the compile returns."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from tpukit.run import activity as activity_module
from tpukit.run.activity import Activity
from tpukit.run.script import Terminated, sigterm_as_interrupt
from tpukit.run.summary import describe_activity


def _wait_for(test, timeout=5.0):
    end = time.monotonic() + timeout
    while not test() and time.monotonic() < end:
        time.sleep(0.02)
    return test()


def test_a_signal_inside_a_long_call_is_recorded_as_it_arrives(capsys):
    activity = Activity()
    writes = []
    with sigterm_as_interrupt():
        activity.watch(lambda: writes.append(activity.stopped_in))
        try:
            activity.begin("graph barrier", ("/tmp/train.py", 42), True)
            time.sleep(0.2)
            with pytest.raises(Terminated):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            assert _wait_for(lambda: activity.stopped_in is not None)
        finally:
            activity.end()
            activity.stop()
    stopped = activity.stopped_in
    assert stopped["signal"] == "SIGTERM" and stopped["line"] == 42
    assert stopped["call"] == "graph barrier"
    assert stopped["doing"] == "compiling a graph not seen before in this run"
    assert 0.15 <= stopped["for_s"] < 5
    assert _wait_for(lambda: writes) and writes[0] is stopped  # the live report, at once
    assert "SIGTERM arrived in the graph barrier at train.py:42" in capsys.readouterr().err


def test_a_long_call_rewrites_the_live_report_while_it_lasts(monkeypatch):
    monkeypatch.setattr(activity_module, "LONG_S", 0.3)
    activity = Activity()
    seen = []
    activity.watch(lambda: seen.append(activity.in_progress()))
    try:
        activity.begin("host read", ("/tmp/train.py", 7), None)
        assert _wait_for(lambda: seen, timeout=5.0)
    finally:
        activity.end()
        activity.stop()
    assert seen[0]["call"] == "host read" and seen[0]["for_s"] >= 0.3
    assert seen[0]["doing"] == "compiling or running its graph"
    assert activity.stopped_in is None


def test_nothing_under_way_is_nothing_to_say():
    activity = Activity()
    activity.signalled(signal.SIGTERM)
    assert activity.in_progress() is None and activity.stopped_in is None
    activity.begin("graph barrier", None, None)  # no user line: nothing to point at
    assert activity.in_progress() is None


def test_the_watcher_gives_the_wakeup_fd_back():
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    activity = Activity()
    activity.watch(None)
    activity.stop()
    assert signal.set_wakeup_fd(before) == before
    assert not any(t.name == "tpukit-activity" for t in threading.enumerate())


def test_described_in_words():
    said = describe_activity({"call": "graph barrier", "path": "/x/train.py", "line": 3,
                              "doing": "running a graph seen before", "for_s": 2.0})
    assert said == "in the graph barrier at train.py:3 for 2.0 s, running a graph seen before"
    json.dumps(said)


def test_near_the_kernels_mapping_limit_the_run_says_so_before_it_aborts(monkeypatch, capsys):
    # XLA:CPU keeps ~48 memory mappings per compiled graph; at vm.max_map_count LLVM aborts
    # ("Unable to allocate section memory") and no report would say why: the watcher counts
    used = activity_module.mappings_in_use()
    if used is None or activity_module.mapping_limit() is None:
        pytest.skip("no /proc here")
    monkeypatch.setattr(activity_module, "MAPPINGS_EVERY_S", 0.0)
    monkeypatch.setattr(activity_module, "mapping_limit", lambda: int(used / 0.9))
    activity = Activity()
    writes = []
    activity.watch(lambda: writes.append(activity.mappings))
    try:
        assert _wait_for(lambda: writes)
    finally:
        activity.stop()
    assert writes[0]["limit"] == int(used / 0.9) and writes[0]["mappings"] >= used * 0.95
    assert "memory mappings the kernel allows one process" in capsys.readouterr().err


def test_far_from_the_mapping_limit_nothing_is_said(monkeypatch):
    monkeypatch.setattr(activity_module, "MAPPINGS_EVERY_S", 0.0)
    monkeypatch.setattr(activity_module, "mapping_limit", lambda: 10**9)
    activity = Activity()
    activity.watch(None)
    time.sleep(1.5)
    activity.stop()
    assert activity.mappings is None
