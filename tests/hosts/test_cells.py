"""The count of KV cells the embedded host's sequences hold in their shared cache."""

from __future__ import annotations

from openai_ext.hosts.llamacpp.cells import Cells


def test_new_cells_are_counted_and_cut_ones_freed():
    cells = Cells(100, 2)
    cells.grow(0, 30)
    cells.grow(1, 10)
    assert cells.used == 40 and cells.free == 60
    assert cells.freed_by_cut(0, 20) == 10
    cells.cut(0, 20)
    assert cells.used == 30 and cells.length(0) == 20


def test_a_shared_prefix_costs_no_cell_and_is_freed_only_when_no_sequence_holds_it():
    cells = Cells(100, 3)
    cells.grow(0, 40)
    cells.share(0, 1, 30)
    cells.share(0, 2, 30)
    assert cells.used == 40 and cells.length(1) == 30
    cells.grow(1, 5)                       # its own cells after the shared prefix
    assert cells.used == 45
    assert cells.freed_by_cut(0, 0) == 10  # only what no one else holds
    cells.cut(0, 0)
    assert cells.used == 35
    cells.cut(1, 0)
    assert cells.used == 30                # sequence 2 still holds the prefix
    cells.cut(2, 0)
    assert cells.used == 0


def test_sharing_into_a_sequence_drops_what_it_held_before():
    cells = Cells(100, 2)
    cells.grow(0, 10)
    cells.grow(1, 20)
    cells.share(0, 1, 10)
    assert cells.used == 10 and cells.length(1) == 10

