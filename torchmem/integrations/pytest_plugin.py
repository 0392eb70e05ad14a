"""pytest plugin: fail tests whose code leaves torchmem blocks alive.

Registered as the ``torchmem`` ``pytest11`` entry point. A test is checked when it

* requests the ``torchmem_leak_check`` fixture,
* carries ``@pytest.mark.torchmem(...)`` (``enabled=False`` opts a test out), or
* runs under ``pytest --torchmem`` / ``torchmem_autouse = true`` (every test).

Distributed tests: the ``torchmem_distributed`` fixture spawns a process group
(``torchmem_distributed.spawn(fn, world_size=2)``), runs ``fn`` on every rank under a
collective leak check and fails the test with the job's report. When pytest itself runs on
every rank of a job (``torchrun -m pytest``), the per-test check is collective: all ranks
fail a test that leaked on any of them.

The check wraps the test's call phase (after fixtures are set up, before they are torn
down): blocks allocated while the test body ran and still allocated when it returned fail
the test, with the leak report as the failure message. A test that fails on its own is
not analyzed (its traceback keeps its locals alive).

Settings, most specific first: the fixture's indirect parameter, the marker's keywords,
then command-line options, then ini options, then defaults::

    @pytest.mark.torchmem(device="cpu", allow_tags=("cache",), warmup=1, max_leaked_bytes="4 KiB",
                          cycles="repeating", cycle_repeats=8, allow_arguments=True)

    @pytest.mark.parametrize("torchmem_leak_check", [{"cycles": "always"}], indirect=True)
    def test_x(torchmem_leak_check): ...

    pytest --torchmem --torchmem-device=cpu --torchmem-max-leaked-bytes=0 \
           --torchmem-cycles=repeating --torchmem-cycle-repeats=8 --torchmem-allow-arguments=yes

    [pytest]  (or [tool.pytest.ini_options])
    torchmem_autouse = true
    torchmem_device = cpu
    torchmem_max_leaked_bytes = 1 KiB
    torchmem_allow_tags = cache warmup untagged
    torchmem_cycles = repeating
    torchmem_cycle_repeats = 8
    torchmem_allow_arguments = true

``cycles`` / ``cycle_repeats``: when memory held only by a reference cycle fails a test
(``torchmem.leaks.cycle_policy``: by default when it repeats, not when a test merely builds
an object that lives in a cycle, as every torchmetrics ``Metric`` does).
``allow_arguments`` (default true): memory held only through the test's arguments is
allowed, and reported as such: ``@pytest.mark.parametrize`` values (built when the module
is imported and kept by pytest for the whole session; the report names the module-level
object) and fixture values (named with their scope). A test that updates a metric it was
given leaves the metric's new state there; that is the test's input, not a leak.

``warmup=N`` runs the test body N extra times, unchecked, before the checked run, for code
that builds lasting state on first use (lazy caches, optimizer state). ``device="auto"``
(the default) means CUDA when PyTorch sees a GPU, else CPU. CPU checks install torchmem's
CPU allocator on first use; CUDA checks need torchmem installed before CUDA is initialized.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace

import pytest

# The peak limit (limit_peak), --torchmem-top and --torchmem-capture-dir, each in its own module.
pytest_plugins = (
    "torchmem.integrations.pytest_limits",
    "torchmem.integrations.pytest_top",
    "torchmem.integrations.pytest_captures",
)

_MARKER = "torchmem"
_FIXTURE = "torchmem_leak_check"
_MARKER_KEYWORDS = (
    "device", "allow_tags", "warmup", "max_leaked_bytes", "enabled", "cycles", "cycle_repeats", "allow_arguments",
    "limit_peak",
)


@dataclass(frozen=True)
class CheckOptions:
    """How one test is checked (after marker, command line and ini were combined)."""

    enabled: bool
    device: str
    allow_tags: tuple
    warmup: int
    max_leaked_bytes: int
    cycles: str = "repeating"
    cycle_repeats: int = 8
    allow_arguments: bool = True
    dist_timeout: float = 300.0


class MarkerError(ValueError):
    """A ``@pytest.mark.torchmem`` with arguments it does not take; fails that test."""


_OPTIONS_KEY = pytest.StashKey[CheckOptions]()
# {test class: {name: id(value)}}, each taken before the class's first test's setup.
_CLASS_BODIES_KEY = pytest.StashKey[dict]()
_CHECK_KEY = pytest.StashKey[object]()
_HINT = (
    "(torchmem pytest plugin: tensors allocated by this test are still alive after it returned. Keep "
    "expected survivors with torchmem.expect_alive(tensor), or configure the check with "
    "@pytest.mark.torchmem(allow_tags=..., warmup=..., max_leaked_bytes=..., cycles=..., enabled=False))"
)
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def pytest_addoption(parser) -> None:
    """Registers ``--torchmem*`` command-line options and ``torchmem_*`` ini options."""
    group = parser.getgroup("torchmem", "torchmem leak checks")
    # Command-line options default to None so an unset flag falls back to the ini value.
    group.addoption(
        "--torchmem", action="store_true", default=None, dest="torchmem",
        help="check every test for torchmem blocks left alive (ini: torchmem_autouse)",
    )
    group.addoption(
        "--torchmem-device", default=None, dest="torchmem_device", metavar="DEVICE",
        help="device whose blocks are checked: cpu, cuda, cuda:N or auto (ini: torchmem_device; default auto)",
    )
    group.addoption(
        "--torchmem-max-leaked-bytes", default=None, dest="torchmem_max_leaked_bytes", metavar="SIZE",
        help="leaked bytes tolerated per test, e.g. 4096 or '4 KiB' (ini: torchmem_max_leaked_bytes; default 0)",
    )
    group.addoption(
        "--torchmem-cycles", default=None, dest="torchmem_cycles", metavar="POLICY",
        help="when memory held only by reference cycles fails a test: repeating (default: one allocation stack "
             "and holder type leaving --torchmem-cycle-repeats cycles), always, or never (ini: torchmem_cycles)",
    )
    group.addoption(
        "--torchmem-cycle-repeats", default=None, dest="torchmem_cycle_repeats", metavar="N",
        help="cycles from one allocation stack and holder type that fail a test under cycles=repeating "
             "(int >= 2; ini: torchmem_cycle_repeats; default 8)",
    )
    group.addoption(
        "--torchmem-allow-arguments", default=None, dest="torchmem_allow_arguments", metavar="yes|no",
        help="allow memory held only through the test's arguments: parametrize values and fixtures "
             "(ini: torchmem_allow_arguments; default yes)",
    )
    group.addoption(
        "--torchmem-dist-timeout", default=None, dest="torchmem_dist_timeout", metavar="SECONDS",
        help="under torchrun -m pytest: seconds the ranks wait for each other at a test's exchange before "
             "failing it on every rank (ini: torchmem_dist_timeout; default 300)",
    )
    parser.addini("torchmem_dist_timeout", default="300",
                  help="seconds the ranks wait for each other at a test's exchange (torchrun -m pytest)")
    parser.addini("torchmem_autouse", type="bool", default=False, help="check every test for torchmem leaks")
    parser.addini("torchmem_device", default="auto", help="device whose blocks are checked (cpu, cuda[:N], auto)")
    parser.addini("torchmem_max_leaked_bytes", default="0", help="leaked bytes tolerated per test")
    parser.addini(
        "torchmem_allow_tags", type="args", default=[],
        help="torchmem tags whose blocks may survive; 'untagged' allows memory allocated outside every tag",
    )
    parser.addini("torchmem_cycles", default="repeating", help="repeating, always or never (see --torchmem-cycles)")
    parser.addini("torchmem_cycle_repeats", default="8", help="cycles that fail a test under cycles=repeating")
    parser.addini("torchmem_allow_arguments", default="true",
                  help="allow memory held only through the test's arguments (parametrize values, fixtures)")


def pytest_configure(config) -> None:
    """Registers the marker, reads the session-wide settings, installs CUDA early if asked."""
    config.addinivalue_line(
        "markers",
        "torchmem(device='auto', allow_tags=(), warmup=0, max_leaked_bytes=0, cycles='repeating', cycle_repeats=8, "
        "allow_arguments=True, enabled=True, limit_peak=None): check this test for torchmem blocks still alive "
        "when it returns, with these settings; limit_peak='256 MiB' fails it when its own allocations peak above "
        "that on a device",
    )
    defaults = _config_defaults(config)
    if defaults.enabled:
        defaults = _resolved(defaults)
    config.stash[_OPTIONS_KEY] = defaults
    if defaults.enabled and defaults.device.startswith("cuda"):
        # CUDA's allocator can only be swapped before CUDA is initialized: do it before
        # collection imports test modules.
        _install(defaults.device, where="at pytest startup")


def pytest_report_header(config) -> str | None:
    """Says in the session header when every test is checked."""
    defaults = config.stash.get(_OPTIONS_KEY, None)
    if defaults is not None and defaults.enabled:
        return f"torchmem: leak check on every test (device={defaults.device})"
    return None


def _config_defaults(config) -> CheckOptions:
    def pick(option: str, ini: str):
        value = config.getoption(option)
        return value if value is not None else config.getini(ini)

    try:
        from torchmem._support.units import parse_bytes
        from torchmem.leaks import cycle_policy

        return CheckOptions(
            enabled=bool(pick("torchmem", "torchmem_autouse")),
            device=_check_device(pick("torchmem_device", "torchmem_device")),
            allow_tags=tuple(config.getini("torchmem_allow_tags")),
            warmup=0,
            max_leaked_bytes=parse_bytes(
                pick("torchmem_max_leaked_bytes", "torchmem_max_leaked_bytes"),
                what="torchmem: --torchmem-max-leaked-bytes / torchmem_max_leaked_bytes",
            ),
            cycles=cycle_policy.normalize_policy(
                pick("torchmem_cycles", "torchmem_cycles"), what="torchmem: --torchmem-cycles / torchmem_cycles"
            ),
            cycle_repeats=cycle_policy.normalize_repeats(
                pick("torchmem_cycle_repeats", "torchmem_cycle_repeats"),
                what="torchmem: --torchmem-cycle-repeats / torchmem_cycle_repeats",
            ),
            allow_arguments=_boolean(
                pick("torchmem_allow_arguments", "torchmem_allow_arguments"),
                what="torchmem: --torchmem-allow-arguments / torchmem_allow_arguments",
            ),
            dist_timeout=_seconds(
                pick("torchmem_dist_timeout", "torchmem_dist_timeout"),
                what="torchmem: --torchmem-dist-timeout / torchmem_dist_timeout",
            ),
        )
    except (TypeError, ValueError) as error:
        raise pytest.UsageError(str(error)) from None


def _seconds(value, *, what: str) -> float:
    from torchmem._support.validate import require_seconds

    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass  # refused below, with the text as given
    return require_seconds(value, what=what)


def _boolean(value, *, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
        return _BOOLEANS[value.strip().lower()]
    raise ValueError(f"{what} must be yes or no (true/false, 1/0), got {value!r}")


def _check_device(device) -> str:
    """The device as a string ('auto' kept: resolved only for a test that is checked, so that
    a session without checks never imports torch)."""
    torch = sys.modules.get("torch")  # a torch.device exists only once torch is imported
    if torch is not None and isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"torchmem: device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    device = device.strip()
    kind = device.split(":", 1)[0]
    if device != "auto" and kind not in ("cpu", "cuda"):
        raise ValueError(f"torchmem: unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return device


@functools.cache
def _auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolved(options: CheckOptions) -> CheckOptions:
    """``options`` with device 'auto' made concrete: CUDA when PyTorch sees a GPU, else CPU."""
    return replace(options, device=_auto_device()) if options.device == "auto" else options


def _options_for(item) -> CheckOptions:
    options = item.config.stash.get(_OPTIONS_KEY, None)
    if options is None:  # plugin registered late (e.g. by pytest_plugins in a conftest)
        options = item.config.stash[_OPTIONS_KEY] = _config_defaults(item.config)
    uses_fixture = _FIXTURE in getattr(item, "fixturenames", ())
    marker = item.get_closest_marker(_MARKER)
    kwargs: dict = {}
    where = ""
    if marker is not None:
        if marker.args:
            raise MarkerError(
                f"@pytest.mark.torchmem takes keyword arguments only ({', '.join(_MARKER_KEYWORDS)}); "
                f"got positional {marker.args!r} on {item.nodeid}"
            )
        kwargs.update(marker.kwargs)
        where = "@pytest.mark.torchmem"
    fixture_param = _fixture_param(item)
    if fixture_param is not None:
        if not isinstance(fixture_param, dict):
            raise MarkerError(
                f"{item.nodeid}: the {_FIXTURE} fixture's indirect parameter must be a dict of options "
                f"({', '.join(_MARKER_KEYWORDS)}), got {fixture_param!r}"
            )
        kwargs.update(fixture_param)
        where = f"the {_FIXTURE} fixture's parameter" if not where else f"{where} / the {_FIXTURE} parameter"
    if not where:
        options = replace(options, enabled=options.enabled or uses_fixture)
        return _resolved(options) if options.enabled else options
    unknown = sorted(set(kwargs) - set(_MARKER_KEYWORDS))
    if unknown:
        raise MarkerError(
            f"{where} on {item.nodeid}: unknown option(s) {', '.join(unknown)}; known: {', '.join(_MARKER_KEYWORDS)}"
        )
    try:
        from torchmem.leaks.check import _normalize_tags
        from torchmem.leaks import cycle_policy
        from torchmem._support.units import parse_bytes

        from torchmem._support.validate import require_int

        warmup = require_int(kwargs.get("warmup", 0), what="warmup", minimum=0, meaning="extra unchecked runs")
        checked = CheckOptions(
            enabled=bool(kwargs.get("enabled", True)),
            device=_check_device(kwargs.get("device", options.device)),
            allow_tags=tuple(sorted(_normalize_tags(kwargs.get("allow_tags", options.allow_tags)))),
            warmup=warmup,
            max_leaked_bytes=parse_bytes(
                kwargs.get("max_leaked_bytes", options.max_leaked_bytes), what="max_leaked_bytes"
            ),
            cycles=cycle_policy.normalize_policy(kwargs.get("cycles", options.cycles), what="cycles"),
            cycle_repeats=cycle_policy.normalize_repeats(
                kwargs.get("cycle_repeats", options.cycle_repeats), what="cycle_repeats"
            ),
            allow_arguments=_boolean(kwargs.get("allow_arguments", options.allow_arguments), what="allow_arguments"),
            dist_timeout=options.dist_timeout,
        )
        return _resolved(checked) if checked.enabled else checked
    except (TypeError, ValueError) as error:
        raise MarkerError(f"{where} on {item.nodeid}: {error}") from None


def _fixture_param(item):
    """The indirect parameter given to the fixture, if any (``callspec.params``)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    return callspec.params.get(_FIXTURE)


def _checked_options(item) -> CheckOptions:
    try:
        return _options_for(item)
    except MarkerError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)  # outside the except: no "during handling" chain


def _install(device: str, *, where: str) -> None:
    import torchmem

    if device == "cpu":
        torchmem.install("cpu")
        return
    if torchmem.is_installed("cuda"):
        return
    try:
        torchmem.install("cuda")
    except RuntimeError as error:
        raise pytest.UsageError(
            f"torchmem: cannot check CUDA memory ({where}): {error}\n"
            "torchmem must be installed before CUDA is initialized. Set the device at startup "
            "(pytest --torchmem-device=cuda, or torchmem_device = cuda in the ini file) so the plugin "
            "installs it before tests are collected, or call torchmem.install() at the top of your "
            "conftest.py; use device='cpu' to check CPU memory instead."
        ) from None


def _install_for_test(device: str, item) -> None:
    try:
        _install(device, where=f"for {item.nodeid}")
        return
    except pytest.UsageError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)


def _make_check(options: CheckOptions, item):
    import torchmem

    kwargs = dict(
        raise_on_leak=False,
        allow_tags=options.allow_tags,
        warmup=options.warmup,
        max_leaked_bytes=options.max_leaked_bytes,
        devices=[options.device],
        cycles=options.cycles,
        cycle_repeats=options.cycle_repeats,
    )
    if _in_process_group():
        # pytest run on every rank of a job (torchrun -m pytest): the ranks decide together, so a
        # leak on one rank fails the test on all of them and none runs ahead into the next test.
        # Every exchange carries the test's node id (ranks at different tests fail, naming both)
        # and is bounded by the timeout.
        import torchmem.distributed

        return torchmem.distributed.leak_check(label=item.nodeid, timeout=options.dist_timeout, **kwargs)
    return torchmem.leak_check(**kwargs)


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _failing_report(check):
    """What fails the test: the collective report of a torchmem.distributed check (every rank's
    findings), else this process's report."""
    job = getattr(check, "job", None)
    return job if job is not None else check.report


def pytest_collection_modifyitems(session, config, items) -> None:
    """Installs torchmem for CUDA before any test runs if a collected test checks CUDA, and
    indexes module globals for the owner search if any test is checked."""
    # While it is still possible: a CUDA install after CUDA initialization fails.
    checked = False
    for item in items:
        try:
            options = _options_for(item)
        except MarkerError:
            continue  # fails that test when it runs
        checked = checked or options.enabled
        if options.enabled and options.device.startswith("cuda"):
            try:
                _install(options.device, where=f"for {item.nodeid}")
            except pytest.UsageError:
                continue  # fails that test, with the explanation, when it runs
    if checked:
        from torchmem.leaks import owners

        owners.warm_up()  # once, now that the test modules are imported


@pytest.fixture
def torchmem_leak_check(request):
    """Checks this test for torchmem blocks still alive when its body returns; fails it
    with the leak report. Yields the ``torchmem.leak_check`` (its ``.report`` is filled
    after the body ran). Configure it with ``@pytest.mark.torchmem(...)``, or with a dict
    of the same options as its indirect parameter::

        @pytest.mark.parametrize("torchmem_leak_check", [{"cycles": "always"}], indirect=True)
    """
    options = _checked_options(request.node)
    _install_for_test(options.device, request.node)
    check = _make_check(options, request.node)
    request.node.stash[_CHECK_KEY] = check
    yield check


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """Under ``torchrun -m pytest``: a rank whose setup failed or skipped (a fixture error, a
    ``skipif`` true on one rank) still takes part in this test's exchange, so the other ranks
    fail this test naming it, instead of pairing their next test with this one.

    Before the first test of a class is set up, the class's namespace is recorded: what its
    class-scoped setup then adds is a fixture the tests share (``pytest_arguments``)."""
    cls = getattr(item, "cls", None)
    if cls is not None:
        bodies = item.config.stash.setdefault(_CLASS_BODIES_KEY, {})
        if cls not in bodies:
            bodies[cls] = {name: id(value) for name, value in vars(cls).items()}
    try:
        return (yield)
    except BaseException as error:
        _settle_failed_setup(item, error)
        raise


def _settle_failed_setup(item, error: BaseException) -> None:
    try:
        options = _options_for(item)
    except MarkerError:
        return  # the same on every rank: every rank fails the test before any exchange
    if not options.enabled or not _in_process_group():
        return
    try:
        _install(options.device, where=f"for {item.nodeid}")
        check = item.stash.get(_CHECK_KEY, None) or _make_check(options, item)
        check.__enter__()
        check.__exit__(type(error), error, error.__traceback__)
    except Exception:  # noqa: BLE001 - the exchange failed too; the setup error is what this rank reports
        pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Runs the test's call phase inside a leak check (after ``warmup`` unchecked runs) and
    fails the test with the report when it leaked more than allowed."""
    options = _checked_options(item)
    if not options.enabled:
        return (yield)
    _install_for_test(options.device, item)
    check = item.stash.get(_CHECK_KEY, None) or _make_check(options, item)
    item.stash[_CHECK_KEY] = check  # --torchmem-capture-dir puts its findings in the test's capture
    from torchmem.integrations.pytest_arguments import argument_roots

    # The test's arguments name holders either way; allow_arguments also allows them.
    cls = getattr(item, "cls", None)
    body = item.config.stash.get(_CLASS_BODIES_KEY, {}).get(cls) if cls is not None else None
    check.allowed_roots = argument_roots(item, exclude=(_FIXTURE,), allowed=options.allow_arguments,
                                         class_body_before_setup=body)
    for _ in range(options.warmup):
        with check:
            item.runtest()
    check.__enter__()
    try:
        result = yield
    except BaseException:
        check.__exit__(*sys.exc_info())
        raise
    check.__exit__(None, None, None)
    if getattr(check, "job", None) is None and check.report is not None:
        # A module the test imported for the first time keeps what its import made (a library's
        # constants) for the session: import-time, not the test's leak. (Under torchrun the ranks
        # decided inside the exit already.)
        from torchmem.integrations import import_time

        check.report = import_time.classify(check.report, None)
    report = check.report
    if report.findings:
        # In JUnit XML (--junitxml) and to other plugins: what the check found and what it cost.
        item.user_properties.append(("torchmem_leaked_bytes", report.leaked_bytes))
        item.user_properties.append(("torchmem_analysis_ms", round(report.analysis_seconds * 1000, 3)))
        item.user_properties.append(("torchmem_analysis_cpu_ms", round(report.analysis_cpu_seconds * 1000, 3)))
    failing = _failing_report(check)
    if failing.exceeds_limit:
        pytest.fail(f"{failing.render()}\n{_HINT}", pytrace=False)
    return result


@pytest.fixture
def torchmem_distributed(request):
    """Runs a function on N ranks (new processes forming a process group), with torchmem in each
    and a collective leak check around the function; fails the test with the job's report when
    a rank leaked, or with each failed rank's traceback. Configure it with
    ``@pytest.mark.torchmem(device=..., allow_tags=..., warmup=..., max_leaked_bytes=...)``::

        def test_ddp_step(torchmem_distributed):
            torchmem_distributed.spawn(ddp_step, world_size=2)   # ddp_step(rank, world_size)
    """
    options = _checked_options(request.node)
    marker = request.node.get_closest_marker(_MARKER)
    # Asking for the fixture turns the ranks' check on, unless the marker turns it off.
    checked = marker is None or marker.kwargs.get("enabled", True) is not False
    return _DistributedRunner(_resolved(replace(options, enabled=checked)))


class _DistributedRunner:
    """The ``torchmem_distributed`` fixture: ``torchmem.distributed.spawn`` with the test's settings."""

    def __init__(self, options: CheckOptions):
        self.options = options

    def spawn(self, fn, world_size: int = 2, *, args: tuple = (), backend: str = "gloo", timeout: float = 120.0):
        """``fn(rank, world_size, *args)`` on ``world_size`` ranks; returns their return values."""
        from torchmem.distributed.errors import DistributedLeakError
        from torchmem.distributed.spawn import SpawnError, spawn

        options = self.options
        try:
            return spawn(
                fn, world_size=world_size, args=args, backend=backend, devices=(options.device.split(":")[0],),
                timeout=timeout, check=options.enabled, repeat=options.warmup + 1, allow_tags=options.allow_tags,
                warmup=options.warmup, max_leaked_bytes=options.max_leaked_bytes, cycles=options.cycles,
                cycle_repeats=options.cycle_repeats, allow_arguments=options.allow_arguments,
            )
        except DistributedLeakError as error:
            message = f"{error.job.render()}\n{_HINT}"
        except SpawnError as error:
            message = str(error)
        pytest.fail(message, pytrace=False)
