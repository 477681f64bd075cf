"""bench/tables.py's measures: a row is intact when its cells are on one line in order, each whole;
the stricter measure wants each a whole Markdown cell; every chunk of a table opens with its
header."""

from bench.tables import _cells_of, cells_intact, headed_chunks, row_intact, score

ROW = ["North harbour", "1,205", "+3.5%"]


def test_a_row_is_intact_on_one_line_in_order_with_each_cell_whole():
    assert row_intact(ROW, ["| North harbour | 1,205 | +3.5% |"])
    assert row_intact(ROW, ["North harbour 1,205 +3.5% (estimate)"])  # plain text on one line
    assert not row_intact(ROW, ["North harbour", "1,205 +3.5%"])  # cut over two lines
    assert not row_intact(ROW, ["| 1,205 | North harbour | +3.5% |"])  # out of order
    assert not row_intact(ROW, ["| North harbour | 11,205 | +3.5% |"])  # inside a longer number
    assert not row_intact(["Dock", "7"], ["| Dock | 7.5 |"])  # 7 is not 7.5


def test_whole_cells_want_each_cell_a_markdown_cell_of_its_own():
    rows = [c for c in map(_cells_of, ["| North harbour 1,205 | +3.5% |"]) if c is not None]
    assert row_intact(ROW, ["| North harbour 1,205 | +3.5% |"])
    assert not cells_intact(ROW, rows)
    rows = [_cells_of("| North harbour |  | 1,205 | +3.5% |")]
    assert cells_intact(ROW, [r for r in rows if r is not None])  # an empty cell between is fine
    assert _cells_of("North harbour 1,205") is None
    assert _cells_of(r"| a \| b | c |") == ["a | b", "c"]


def test_score_counts_rows_intact_and_whole():
    text = "Intro\n\n| Site | Count |\n| --- | --- |\n| North harbour 1,205 | +3.5% |\n| Dock | 7 |"
    got, whole, missed = score([ROW, ["Dock", "7"], ["Pier", "9"]], text)
    assert (got, whole) == (2, 1)
    assert missed == [["Pier", "9"]]


def test_every_chunk_of_a_long_table_is_counted_with_its_header():
    lines = ["| Site | Count |", "| --- | --- |"] + [f"| Berth {i} | {i * 7} |" for i in range(60)]
    tabled, headed, later = headed_chunks([(1, "A table of berths:\n" + "\n".join(lines))])
    assert tabled > 2
    assert headed == tabled
    assert later == tabled - 1
