"""The package layers of pyproject.toml's [tool.importlinter] contracts, checked by import-linter itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
importlinter = pytest.importorskip("importlinter", reason="the dev extra installs import-linter")


def _report(extra_imports: list[tuple[str, str]]):
    """import-linter's report on the repository's contracts, with `extra_imports` added to the real graph."""
    from importlinter.application import use_cases
    from importlinter.configuration import configure, settings

    configure()
    real = settings.GRAPH_BUILDER

    class WithExtra:
        def build(self, **kwargs):
            graph = real.build(**kwargs)
            for importer, imported in extra_imports:
                graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="(test)")
            return graph

    settings.configure(GRAPH_BUILDER=WithExtra())
    try:
        options = use_cases.read_user_options(str(REPO / "pyproject.toml"))
        # what lint_imports does before its report (import-linter 2.17 renamed it and registers built-ins only)
        register = getattr(use_cases, "_register_contract_types", None)
        if register is not None:
            register(options)
        else:
            use_cases._register_built_in_contract_types()
        return use_cases.create_report(options, cache_dir=None)
    finally:
        settings.configure(GRAPH_BUILDER=real)


def _broken(report) -> set[str]:
    return {check_name for check_name, check in _checks(report) if not check.kept}


def _checks(report):
    for contract, check in report.get_contracts_and_checks():
        yield contract.name, check


def test_lint_imports_keeps_every_contract():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "7 kept, 0 broken" in run.stdout


@pytest.mark.parametrize("importer, imported, contract", [
    ("specexport.runtime.session", "specexport.cli.main", "cli on bench on exporter on runtime"),
    ("specexport.runtime.session", "specexport.exporter.build", "the runtime imports only"),
    ("specexport.runtime.sampling", "torch", "the runtime imports only"),
    ("specexport.exporter.build", "specexport.bench.runner", "the exporter never imports"),
    ("specexport.runtime.decode", "specexport.runtime.session", "no import cycle"),
    ("specexport.doctor.run", "specexport.cli.main", "cli on bench on exporter on runtime"),
    ("specexport.bench.runner", "specexport.doctor.checks", "cli on bench on exporter on runtime"),
    ("specexport.exporter.build", "specexport.doctor.run", "the exporter never imports"),
    ("specexport.runtime.session", "specexport.doctor.checks", "the runtime imports only"),
    ("specexport.runtime.session", "specexport.serve.app", "the runtime imports only"),
    ("specexport.exporter.build", "specexport.serve.app", "the exporter never imports"),
    ("specexport.bench.runner", "specexport.serve.app", "nothing below the cli imports the server"),
    ("specexport.serve.app", "specexport.exporter.build", "the server stands on the runtime alone"),
    ("specexport.serve.app", "specexport.cli.main", "the server stands on the runtime alone"),
    # inside the runtime: the decoder's assembly reads a context, never the session that drives it
    ("specexport.runtime.assemble", "specexport.runtime.session", "inside the runtime"),
    ("specexport.runtime.context", "specexport.runtime.assemble", "inside the runtime"),
    ("specexport.runtime.plan", "specexport.runtime.assemble", "inside the runtime"),
    ("specexport.runtime.context", "specexport.runtime.plan", "inside the runtime"),
    ("specexport.runtime.backends.cuda_streams", "specexport.runtime.decode", "inside the runtime"),
    ("specexport.runtime.decode", "specexport.runtime.batching.scheduler", "inside the runtime"),
    ("specexport.runtime.engine.cost", "specexport.runtime.batching.drafts", "no import cycle"),
    ("specexport.runtime.engine.calls", "specexport.runtime.session", "inside the runtime"),
    ("specexport.runtime.assemble", "specexport.runtime.engine.calls", "inside the runtime"),
    ("specexport.exporter.llama_graph", "specexport.exporter.training.head", "no import cycle"),
])
def test_each_rule_fails_when_broken(importer, imported, contract):
    # the same contracts over the real graph plus one import that breaks a rule: that rule, and only
    # rules that the import touches, must fail
    assert not _broken(_report([])), "the repository itself breaks a contract"
    broken = _broken(_report([(importer, imported)]))
    assert any(name.startswith(contract) for name in broken), broken


def test_imports_behind_type_checking_count():
    """A circle hidden behind `if TYPE_CHECKING:` is still a circle: the contracts see those imports too."""
    import grimp

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["exclude_type_checking_imports"] is False
    graph = grimp.build_graph("specexport.runtime", exclude_type_checking_imports=False)
    # the batch scheduler names the Session only for type checking (runtime/batching/scheduler.py)
    assert graph.direct_import_exists(importer="specexport.runtime.batching.scheduler",
                                      imported="specexport.runtime.session")
