"""The house's import contracts, read from the code's own imports (grimp): the gateway's rooms import each other one
way only, and the report store sits below both roles that write to it."""

from __future__ import annotations

import grimp
import pytest

GATEWAY = "edgeinspect.services.gateway"
OUTPUTS = "edgeinspect.services.outputs"
STORE = "edgeinspect.services.store"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("edgeinspect", cache_dir=None)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_module_of_the_gateway_is_part_of_an_import_cycle(graph):
    cycles = []
    for module in sorted(m for m in graph.modules if _inside(m, GATEWAY)):
        for imported in graph.find_modules_directly_imported_by(module):
            if _inside(imported, GATEWAY) and graph.chain_exists(importer=imported, imported=module):
                back = graph.find_shortest_chain(importer=imported, imported=module) or ()
                cycles.append(" -> ".join((module, *back)))
    assert not cycles, "import cycles in the gateway:\n" + "\n".join(cycles)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        (OUTPUTS, GATEWAY),  # the outputs are hosted by the gateway (and by ingest): they never reach back into it
        (STORE, GATEWAY),
        (STORE, OUTPUTS),
    ],
)
def test_a_lower_room_never_imports_the_rooms_built_on_it(graph, importer, imported):
    chains = graph.find_shortest_chains(importer=importer, imported=imported, as_packages=True)
    assert not chains, f"{importer} imports {imported}: " + "; ".join(" -> ".join(c) for c in sorted(chains))


def test_gateway_and_outputs_share_the_report_database_through_the_store(graph):
    assert graph.chain_exists(importer=GATEWAY, imported=STORE, as_packages=True)
    assert graph.chain_exists(importer=OUTPUTS, imported=STORE, as_packages=True)
