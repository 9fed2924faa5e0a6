"""torch_xla's persistent compilation cache under `tpukit run`: on by default, so that a second
run of the same program loads its graphs instead of compiling them again.

torch_xla reads the cache's folder from XLA_PERSISTENT_CACHE_PATH when it makes its computation
cache, at the first graph (`xr.initialize_cache` only sets that variable and
XLA_PERSISTENT_CACHE_READ_ONLY): setting them before the script runs is what
`xr.initialize_cache(path)` at the script's top would do. A graph found on disk counts
`PersistentCacheHit` (and `CachedCompile`, not `CompileTime`: it is not compiled), one not there
`PersistentCacheMiss`, one there that cannot be read back `PersistentCacheDeserializeFailure`
(torch_xla deletes the file and compiles again). Measured with torch_xla 2.9.0 on XLA:CPU: the
first run writes one file per graph; the second counts a deserialize failure for each ("Failed to
deserialize executable: UNIMPLEMENTED: Deserializing serialized executable not supported"): the
CPU client cannot load executables, so what the cache saves shows only on a TPU.

No torch here: the folder is chosen before torch_xla is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PATH_VARIABLE = "XLA_PERSISTENT_CACHE_PATH"
READ_ONLY_VARIABLE = "XLA_PERSISTENT_CACHE_READ_ONLY"
# TPUKIT_COMPILE_CACHE: the folder tpukit uses when the user set no XLA_PERSISTENT_CACHE_PATH,
# or 0 / off for none (what --compile-cache and --no-compile-cache say on one run)
SETTING_VARIABLE = "TPUKIT_COMPILE_CACHE"
OFF = ("0", "off", "false", "no")
COUNTERS = {"hits": "PersistentCacheHit", "misses": "PersistentCacheMiss",
            "failures": "PersistentCacheDeserializeFailure"}


@dataclass
class CacheChoice:
    path: str | None  # None: no persistent cache
    source: str  # "tpukit" (its default folder), "option" (--compile-cache), "user"
    # (XLA_PERSISTENT_CACHE_PATH was set), "off" (--no-compile-cache, TPUKIT_COMPILE_CACHE=0),
    # "unwritable" (the folder could not be made), "started" (torch_xla ran before tpukit run)
    read_only: bool = False
    problem: str = ""  # why a chosen folder is not used


def default_folder(env: dict) -> Path:
    """Where tpukit keeps compiled graphs: XDG's cache folder, as JAX and pip keep theirs."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpukit" / "xla-compile-cache"


def named_folder(env: dict) -> tuple[str | None, str]:
    """The folder the environment names for the cache, and who named it: (None, "off") for
    TPUKIT_COMPILE_CACHE=0, the user's XLA_PERSISTENT_CACHE_PATH ("user"), else
    TPUKIT_COMPILE_CACHE or tpukit's default folder ("tpukit"). What `tpukit run` uses without
    an option, and what `tpukit doctor` checks."""
    setting = env.get(SETTING_VARIABLE, "")
    if setting.lower() in OFF:
        return None, "off"
    if env.get(PATH_VARIABLE):
        return env[PATH_VARIABLE], "user"
    return str(setting or default_folder(env)), "tpukit"


def choose(env: dict, option: str | None, enabled: bool, started: bool) -> CacheChoice:
    """The cache this run uses, and `env` set for it. `option`: --compile-cache DIR; `enabled`:
    no --no-compile-cache; `started`: torch_xla already made its computation cache (the
    variables are read once), so nothing can change."""
    if started:
        path = env.get(PATH_VARIABLE) or None
        return CacheChoice(path, "started", env.get(READ_ONLY_VARIABLE) == "1")
    path, source = (option, "option") if option is not None else named_folder(env)
    if not enabled or path is None:
        env.pop(PATH_VARIABLE, None)
        env.pop(READ_ONLY_VARIABLE, None)
        return CacheChoice(None, "off")
    try:
        os.makedirs(path, exist_ok=True)
        writable = os.access(path, os.W_OK)
    except OSError as exc:
        writable, problem = False, exc.strerror or str(exc)
    else:
        problem = "" if writable else "not writable"
    if not writable and source != "user":
        env.pop(PATH_VARIABLE, None)
        return CacheChoice(None, "unwritable", problem=f"{path}: {problem}")
    env[PATH_VARIABLE] = path
    read_only = env.get(READ_ONLY_VARIABLE) == "1"
    if source != "user":
        env[READ_ONLY_VARIABLE] = "0"
        read_only = False
    return CacheChoice(path, source, read_only)


def counts(counter) -> dict[str, int]:
    """hits, misses, failures so far, by torch_xla's counters (`counter(name)`)."""
    return {key: counter(name) or 0 for key, name in COUNTERS.items()}


def load_seconds(metric_data) -> float:
    """Time torch_xla spent reading graphs from the cache (its PersistentCacheLoad timer)."""
    data = metric_data("PersistentCacheLoad")
    return round(data[1] / 1e9, 6) if data else 0.0


def summary(choice: CacheChoice, totals: dict[str, int], load_s: float,
            hits_after_warmup: int) -> dict:
    """The run report's `compile_cache` object."""
    return {"path": choice.path, "source": choice.source, "read_only": choice.read_only,
            "problem": choice.problem, **totals, "load_s": load_s,
            "hits_after_warmup": hits_after_warmup}


def findings(cache: dict, device: str, script: str) -> list:
    """TPU711: graphs the cache could not read back, graphs after warm-up it served (whose
    causes go unexplained), or no cache where one was asked for. `cache`: summary()'s."""
    from tpukit.rules import load_rules
    from tpukit.run.run_finding import finding

    rule = load_rules()["TPU711"]
    said = []
    where = (script, 1)
    if cache["source"] == "unwritable":
        said.append(rule.say("xla", "unwritable", problem=cache["problem"]))
    if cache["failures"]:
        why = rule.say("xla", "unreadable_cpu") if device == "CPU" else \
            rule.say("xla", "unreadable_other")
        said.append(rule.say("xla", "unreadable", failures=cache["failures"],
                             path=cache["path"], why=why))
    if cache["hits_after_warmup"]:
        said.append(rule.say("xla", "loaded", hits=cache["hits_after_warmup"],
                             path=cache["path"]))
    evidence = {k: cache[k] for k in ("path", "hits", "misses", "failures", "hits_after_warmup")}
    return [finding("TPU711", m.what, where, cause=m.cause, fix=m.fix, **evidence)
            for m in said]
