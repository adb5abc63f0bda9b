"""The learning-curve SVG: written by trainwise in pure Python, same content as the matplotlib PNG."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import trainwise.files
from trainwise.plots import write_learning_curves_svg

SVG = "{http://www.w3.org/2000/svg}"


def _history(train, val, **extra):
    records = []
    for i, (t, v) in enumerate(zip(train, val), 1):
        record = {"epoch": i, "train_loss": t, "val_loss": v}
        for key, values in extra.items():
            record[key] = values[i - 1]
        records.append(record)
    return records


def _write(tmp_path, history, name="curves.svg", **kwargs):
    path = write_learning_curves_svg(history, tmp_path / name, **kwargs)
    assert path == tmp_path / name
    data = path.read_bytes()
    text = data.decode("utf-8")
    assert not re.search(r"\b(nan|inf)\b", text, re.IGNORECASE)
    return ET.fromstring(data), text


def _panels(root):
    return {panel.get("data-key"): panel for panel in root.iter(f"{SVG}g") if panel.get("class") == "panel"}


def _series(panel, key):
    found = [p for p in panel.iter(f"{SVG}polyline") if p.get("data-key") == key]
    assert len(found) == 1, key
    return [tuple(map(float, pair.split(","))) for pair in found[0].get("points").split()]


def _vline_x(panel, css):
    found = [line for line in panel.iter(f"{SVG}line") if line.get("class") == css]
    assert len(found) == 1, css
    assert found[0].get("x1") == found[0].get("x2")
    return float(found[0].get("x1"))


def _texts(node):
    return ["".join(t.itertext()) for t in node.iter(f"{SVG}text")]


def test_structure_size_title_and_font(tmp_path):
    history = _history([1.0, 0.7, 0.5, 0.4], [1.1, 0.8, 0.7, 0.75], val_accuracy=[0.5, 0.6, 0.7, 0.72])
    root, text = _write(tmp_path, history, monitor="val_loss", best_epoch=3, overfitting_epoch=4)
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    assert root.tag == f"{SVG}svg"
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == ("900", "400", "0 0 900 400")
    assert root.get("font-family") == "sans-serif"
    assert root.find(f"{SVG}title").text
    panels = _panels(root)
    assert list(panels) == ["loss", "val_accuracy"]
    loss_texts = _texts(panels["loss"])
    for label in ("loss", "epoch", "training loss", "validation loss", "best epoch 3", "overfitting from 4"):
        assert label in loss_texts, label
    assert {"val_accuracy", "epoch", "best epoch 3", "overfitting from 4"} <= set(_texts(panels["val_accuracy"]))
    for panel in panels.values():
        assert any(p.get("class") == "grid" and p.get("d") for p in panel.iter(f"{SVG}path"))
        assert len(list(panel.iter(f"{SVG}circle"))) >= 4  # markers on the lines (and in the legend)


def test_points_match_the_values_and_their_order(tmp_path):
    train = [2.0, 1.2, 0.9, 0.95, 0.6, 0.61]
    val = [2.5, 1.0, 1.4, 0.3, 0.7, 0.8]
    root, _ = _write(tmp_path, _history(train, val))
    loss = _panels(root)["loss"]
    train_points, val_points = _series(loss, "train_loss"), _series(loss, "val_loss")
    assert len(train_points) == len(train) and len(val_points) == len(val)
    xs = [x for x, _ in train_points]
    assert xs == sorted(xs) and len(set(xs)) == len(xs) and xs == [x for x, _ in val_points]
    # All values share one y axis: a higher loss is higher up, i.e. a smaller y.
    values = train + val
    ys = [y for _, y in train_points + val_points]
    for i in range(len(values)):
        for j in range(len(values)):
            if values[i] > values[j]:
                assert ys[i] < ys[j], (values[i], values[j])
    top, bottom = min(ys), max(ys)
    frame = loss.find(f"{SVG}rect")
    assert float(frame.get("y")) <= top and bottom <= float(frame.get("y")) + float(frame.get("height"))


def test_best_and_overfitting_lines_sit_at_their_epochs(tmp_path):
    history = _history([1.0, 0.8, 0.6, 0.5, 0.45, 0.4], [1.0, 0.8, 0.7, 0.75, 0.8, 0.9], val_accuracy=[0.1] * 6)
    root, _ = _write(tmp_path, history, best_epoch=3, overfitting_epoch=4)
    for key, panel in _panels(root).items():
        series = "train_loss" if key == "loss" else "val_accuracy"
        xs = [x for x, _ in _series(panel, series)]  # epochs 1..6
        assert _vline_x(panel, "best-epoch") == pytest.approx(xs[2], abs=0.11)
        assert _vline_x(panel, "overfitting") == pytest.approx(xs[3], abs=0.11)
        assert xs[2] < _vline_x(panel, "overfitting")
        styles = {line.get("class"): line.get("stroke-dasharray") for line in panel.iter(f"{SVG}line")
                  if line.get("class")}
        assert styles["best-epoch"] and styles["overfitting"] and styles["best-epoch"] != styles["overfitting"]


def test_no_lines_without_epochs_to_mark(tmp_path):
    root, _ = _write(tmp_path, _history([1.0, 0.5], [1.0, 0.6]))
    assert not [line for line in root.iter(f"{SVG}line") if line.get("class") in ("best-epoch", "overfitting")]


def test_metric_names_are_escaped(tmp_path):
    name = 'a<b&"c"'
    history = _history([1.0, 0.8, 0.6], [1.1, 0.9, 0.7], **{name: [0.1, 0.2, 0.3]})
    root, text = _write(tmp_path, history, monitor=name, best_epoch=2)
    assert 'a&lt;b&amp;"c"' in text or "a&lt;b&amp;&quot;c&quot;" in text
    panel = _panels(root)[name]
    assert name in _texts(panel)  # the panel title, back to the user's name after parsing
    assert len(_series(panel, name)) == 3
    assert root.get("width") == "900"


def test_escaping_agrees_with_saxutils():
    from xml.sax.saxutils import escape

    from trainwise.plots import _escape

    for text in ('a<b&"c"', "&amp;", "x > y", "plain", "<<&&>>\"'", "ünïcode ∞"):
        assert _escape(text) == escape(text, {'"': "&quot;"})


def test_control_characters_in_a_name_still_give_valid_xml(tmp_path):
    name = "acc\x01\x1b[0m"
    history = _history([1.0, 0.8], [1.1, 0.9], **{name: [0.1, 0.2]})
    root, _ = _write(tmp_path, history, monitor=name)
    assert len(_panels(root)) == 2


def test_none_nan_inf_and_missing_values_are_skipped(tmp_path):
    history = _history([1.0, math.nan, 0.6, 0.5, math.inf], [1.1, 0.9, None, 0.7, -math.inf],
                       val_accuracy=[0.1, None, math.nan, 0.4, 0.5])
    del history[3]["val_loss"]  # an epoch without validation
    root, _ = _write(tmp_path, history, monitor="val_accuracy")
    panels = _panels(root)
    train = _series(panels["loss"], "train_loss")
    val = _series(panels["loss"], "val_loss")
    acc = _series(panels["val_accuracy"], "val_accuracy")
    assert (len(train), len(val), len(acc)) == (3, 2, 3)
    all_xs = sorted({x for x, _ in train + val})
    # The line skips the missing epochs: its points are the finite ones, at their own epochs.
    assert [x for x, _ in val] == [all_xs[0], all_xs[1]]  # epochs 1 and 2
    assert len(list(panels["loss"].iter(f"{SVG}circle"))) >= 5  # one marker per finite point


def test_a_series_with_no_finite_value_draws_no_line(tmp_path):
    history = _history([1.0, 0.8], [None, math.nan])
    root, _ = _write(tmp_path, history)
    loss = _panels(root)["loss"]
    assert len(_series(loss, "train_loss")) == 2
    assert not [p for p in loss.iter(f"{SVG}polyline") if p.get("data-key") == "val_loss"]
    assert "validation loss" not in _texts(loss)


def test_empty_history(tmp_path):
    root, _ = _write(tmp_path, [])
    assert (root.get("width"), root.get("viewBox")) == ("600", "0 0 600 400")
    assert any("no epochs" in t for t in _texts(root))
    assert not list(root.iter(f"{SVG}polyline"))


def test_one_epoch(tmp_path):
    root, _ = _write(tmp_path, [{"epoch": 1, "train_loss": 0.7, "val_loss": 0.7}], best_epoch=1)
    loss = _panels(root)["loss"]
    (tx, ty), = _series(loss, "train_loss")
    frame = loss.find(f"{SVG}rect")
    left, width = float(frame.get("x")), float(frame.get("width"))
    top, height = float(frame.get("y")), float(frame.get("height"))
    assert left < tx < left + width and top < ty < top + height  # inside, not on a zero-size axis
    assert _vline_x(loss, "best-epoch") == pytest.approx(tx, abs=0.11)
    labels = [t.text for t in loss.iter(f"{SVG}text") if t.get("text-anchor") == "end"]
    assert len(labels) >= 2 and len(set(labels)) == len(labels)  # readable, distinct y ticks
    assert len(list(loss.iter(f"{SVG}circle"))) >= 2  # a single point is still visible


@pytest.mark.parametrize(("monitor", "has_accuracy", "expected"), [
    (None, True, "val_accuracy"),
    ("train_loss", True, "val_accuracy"),
    ("val_loss", True, "val_accuracy"),
    ("val_loss", False, None),
    (None, False, None),
    ("val_f1", True, "val_f1"),
    ("absent_metric", True, None),
])
def test_monitor_panel_rule(tmp_path, monitor, has_accuracy, expected):
    history = _history([1.0, 0.8], [1.1, 0.9], val_f1=[0.3, 0.4])
    if has_accuracy:
        for record in history:
            record["val_accuracy"] = 0.5
    root, _ = _write(tmp_path, history, monitor=monitor)
    panels = _panels(root)
    assert list(panels) == ["loss"] + ([expected] if expected else [])
    assert root.get("width") == ("900" if expected else "600")


@pytest.mark.parametrize("scale", [1e30, 1e-30, 1e300, -1.0, -1e30])
def test_huge_tiny_and_negative_values(tmp_path, scale):
    history = _history([scale * v for v in (3.0, 2.0, 1.5, 1.0)], [scale * v for v in (3.5, 2.5, 2.0, 2.2)])
    root, _ = _write(tmp_path, history)
    loss = _panels(root)["loss"]
    train = [y for _, y in _series(loss, "train_loss")]
    assert (train == sorted(train)) == (scale > 0)  # falling positive losses go down the picture
    labels = [t.text for t in loss.iter(f"{SVG}text") if t.get("text-anchor") == "end"]
    assert 3 <= len(labels) <= 8 and len(set(labels)) == len(labels)
    assert all(len(label) <= 10 for label in labels)


def test_extreme_values_do_not_overflow(tmp_path):
    history = _history([1.7e308, -1.7e308, 1e-320], [-1.7e308, 1.7e308, 0.0])
    root, _ = _write(tmp_path, history)
    ys = [y for _, y in _series(_panels(root)["loss"], "train_loss")]
    assert ys[0] < ys[2] < ys[1]


def test_many_epochs_polyline_without_markers_and_thinned_ticks(tmp_path):
    history = _history([1 / (e + 1) for e in range(1000)], [1.2 / (e + 1) for e in range(1000)])
    root, text = _write(tmp_path, history)
    loss = _panels(root)["loss"]
    assert len(_series(loss, "train_loss")) == 1000 and len(_series(loss, "val_loss")) == 1000
    assert len(list(loss.iter(f"{SVG}circle"))) <= 4  # legend samples only
    epochs = [int(t.text) for t in loss.iter(f"{SVG}text") if t.get("text-anchor") == "middle"
              and t.text and t.text.isdigit()]
    assert 3 <= len(epochs) <= 12 and epochs == sorted(epochs)
    assert len({b - a for a, b in itertools.pairwise(epochs)}) == 1  # evenly spaced integer epochs
    assert len(text) < 200_000


def test_markers_up_to_sixty_points(tmp_path):
    history = _history([1 / (e + 1) for e in range(60)], [None] * 60)
    root, _ = _write(tmp_path, history)
    markers = [g for g in root.iter(f"{SVG}g") if g.get("class") == "markers"]
    assert len(markers) == 1 and len(list(markers[0])) == 60


def test_written_atomically_old_file_survives_a_failed_write(tmp_path, monkeypatch):
    path = tmp_path / "curves.svg"
    path.write_text("old good content")
    real_atomic_write = trainwise.files.atomic_write

    def failing_atomic_write(target, write):
        def write_then_fail(file):
            write(file)  # the new SVG goes to the temporary file, then the disk "fails"
            raise OSError(28, "No space left on device")

        return real_atomic_write(target, write_then_fail)

    monkeypatch.setattr(trainwise.files, "atomic_write", failing_atomic_write)
    with pytest.raises(OSError):
        write_learning_curves_svg(_history([1.0, 0.5], [1.1, 0.6]), path)
    assert path.read_text() == "old good content"
    assert [p.name for p in tmp_path.iterdir()] == ["curves.svg"]  # no temporary file left behind
    monkeypatch.undo()
    write_learning_curves_svg(_history([1.0, 0.5], [1.1, 0.6]), path)
    ET.parse(path)


def test_creates_the_folder(tmp_path):
    path = write_learning_curves_svg(_history([1.0], [1.0]), tmp_path / "run" / "curves.svg")
    assert path.is_file()


def test_importing_and_writing_needs_no_matplotlib(tmp_path):
    code = (
        "import sys\n"
        "import trainwise.plots as plots\n"
        "assert 'matplotlib' not in sys.modules and 'numpy' not in sys.modules, 'imported on import'\n"
        "plots.write_learning_curves_svg([{'epoch': 1, 'train_loss': 1.0, 'val_accuracy': 0.5}], sys.argv[1],"
        " best_epoch=1)\n"
        "assert 'matplotlib' not in sys.modules and 'numpy' not in sys.modules, 'imported on write'\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.svg")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    ET.parse(tmp_path / "c.svg")
