"""The gate: only pristine 0.5.12.x is patched; anything else is left untouched, loudly."""

from __future__ import annotations

import inspect
import logging
import sys
from types import SimpleNamespace

import pytest

import sglang_futuremap_patch as plugin
from sglang_futuremap_patch import PatchError, _engine
from sglang_futuremap_patch._api import read_mode

from conftest import resolve


def _snapshot(series):
    out = {}
    for bp in series:
        for t in bp.targets:
            owner, attr = resolve(t.path)
            out[t.path] = (owner, attr, owner.__dict__.get(attr, _engine.ABSENT))
    return out


def _assert_untouched(before):
    for path, (owner, attr, original) in before.items():
        assert owner.__dict__.get(attr, _engine.ABSENT) is original, path
    assert _engine.applied_backports() == []


def test_pristine_0512post1_is_patched(clean_state):
    report = plugin.apply(mode="strict")
    assert report.verdict.decision == "patch"
    assert report.applied == [bp.id for bp in clean_state]


@pytest.mark.parametrize("version", ["0.5.12", "0.5.12.post1"])
def test_both_supported_versions_pass_the_gate(clean_state, version):
    assert _engine.gate(clean_state, version).decision == "patch"


def test_upstream_release_is_left_alone_with_one_info_line(clean_state, caplog):
    before = _snapshot(clean_state)
    with caplog.at_level(logging.INFO, logger="sglang_futuremap_patch"):
        report = plugin.apply(mode="strict", version="0.5.13")
    assert report.verdict.decision == "upstream" and not report.patched
    lines = [r for r in caplog.records if r.name == "sglang_futuremap_patch"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "0.5.13 already ships publish/stash" in lines[0].getMessage()
    _assert_untouched(before)


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12.post2", "0.5.12rc1"])
def test_other_versions_warn_once_and_change_nothing(clean_state, caplog, version):
    before = _snapshot(clean_state)
    with caplog.at_level(logging.INFO, logger="sglang_futuremap_patch"):
        report = plugin.apply(mode="safe", version=version)
    assert report.verdict.decision == "unsupported"
    lines = [r for r in caplog.records if r.name == "sglang_futuremap_patch"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert version in lines[0].getMessage() and "left untouched" in lines[0].getMessage()
    _assert_untouched(before)


def test_strict_mode_raises_on_unsupported_version(clean_state):
    with pytest.raises(PatchError, match="0.5.11"):
        plugin.apply(mode="strict", version="0.5.11")
    assert _engine.applied_backports() == []


def test_edited_source_is_detected_and_nothing_is_patched(clean_state, caplog, monkeypatch):
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    def filter_batch(self, *args, **kwargs):  # a local edit of the stock method
        return None

    monkeypatch.setattr(ScheduleBatch, "filter_batch", filter_batch)
    before = _snapshot(clean_state)
    with caplog.at_level(logging.WARNING, logger="sglang_futuremap_patch"):
        report = plugin.apply(mode="safe")
    assert report.verdict.decision == "mismatch"
    message = caplog.records[-1].getMessage()
    assert "ScheduleBatch.filter_batch is mismatch" in message
    _assert_untouched(before)  # all or nothing: the 23 other targets were not touched either
    with pytest.raises(PatchError, match="filter_batch"):
        plugin.apply(mode="strict")


def test_a_name_that_already_exists_is_a_mismatch(clean_state, monkeypatch):
    from sglang.srt.managers.overlap_utils import FutureMap

    monkeypatch.setattr(FutureMap, "publish", lambda self, *a: None, raising=False)
    verdict = _engine.gate(clean_state)
    assert verdict.decision == "mismatch"
    assert "FutureMap.publish is mismatch (already defined)" in verdict.reason


def test_fingerprint_ignores_comments_and_layout_but_not_code():
    def a(x):
        # a comment
        return max(x, 1)

    def b(x):
        return max(
            x,
            1,  # black's trailing comma
        )

    def c(x):
        return max(x, 2)

    assert _engine.fingerprint(a) == _engine.fingerprint(b) != _engine.fingerprint(c)


def test_replacement_reading_a_name_missing_in_the_target_module_fails_the_gate(clean_state):
    def uses_unknown(self):
        return definitely_not_in_sglang  # noqa: F821

    target = _engine.Target("sglang.srt.managers.overlap_utils", "FutureMap.extra", uses_unknown,
                            expected=_engine.ABSENT)
    bp = _engine.Backport("x", "x", (1,), "x.patch", (target,))
    verdict = _engine.gate([bp])
    assert verdict.decision == "mismatch" and "definitely_not_in_sglang" in verdict.reason


@pytest.mark.parametrize("raw,mode", [("off", "off"), ("SAFE", "safe"), (" strict ", "strict"), ("", "safe")])
def test_mode_values(raw, mode):
    assert read_mode({"SGLANG_FUTUREMAP_PATCH": raw}) == mode


@pytest.mark.parametrize("raw", ["on", "1", "true", "stricter"])
def test_bad_mode_values_are_a_clear_error(raw):
    with pytest.raises(ValueError, match=r"is not one of off, safe, strict"):
        read_mode({"SGLANG_FUTUREMAP_PATCH": raw})


def test_off_mode_changes_nothing_and_says_so(clean_state, caplog):
    before = _snapshot(clean_state)
    with caplog.at_level(logging.INFO, logger="sglang_futuremap_patch"):
        report = plugin.apply(mode="off")
    assert report.verdict.decision == "off"
    assert "disabled by SGLANG_FUTUREMAP_PATCH=off" in caplog.records[-1].getMessage()
    _assert_untouched(before)


def test_patched_source_tree_is_recognised_as_already_carrying_the_change(clean_state):
    """A tree with patches/ applied: every target already is the replacement, as source."""
    plugin.apply(mode="strict")
    saved = (_engine._STATE.applied, _engine._STATE.backports)
    _engine._STATE.applied, _engine._STATE.backports = [], []  # the engine forgets, objects stay
    try:
        verdict = _engine.gate(clean_state)
    finally:
        _engine._STATE.applied, _engine._STATE.backports = saved
    assert verdict.decision == "upstream", verdict.reason
    assert "already carries this back-port" in verdict.reason


def _chain_series(first_fn, second_fn, second_expected):
    owner = "sglang.srt.managers.overlap_utils"
    a = _engine.Backport("a", "a", (1,), "a.patch",
                         (_engine.Target(owner, "FutureMap.extra_method", first_fn, _engine.ABSENT),))
    b = _engine.Backport("b", "b", (2,), "b.patch",
                         (_engine.Target(owner, "FutureMap.extra_method", second_fn, second_expected),))
    return [a, b]


def _v1(self):
    return 1


def _v2(self):
    return 2


def test_a_later_backport_may_replace_a_function_again(clean_state):
    from sglang.srt.managers.overlap_utils import FutureMap

    series = _chain_series(_v1, _v2, _engine.fingerprint(_v1))
    verdict = _engine.gate(series)
    assert verdict.decision == "patch", verdict.reason
    try:
        _engine.install(series, verdict)
        assert FutureMap.extra_method(None) == 2  # only the last link is installed
        assert getattr(FutureMap.__dict__["extra_method"], _engine.MARK) == "b"
    finally:
        _engine.uninstall()
    assert not hasattr(FutureMap, "extra_method")


def test_a_later_link_that_does_not_supersede_the_earlier_one_is_a_mismatch(clean_state):
    verdict = _engine.gate(_chain_series(_v1, _v2, "0123456789abcdef"))
    assert verdict.decision == "mismatch" and "supersedes" in verdict.reason


class _Holder:
    @property
    def backends(self):
        return ["triton"]


def test_property_replacements_are_spliced_as_properties(clean_state):
    from sglang.srt.managers.overlap_utils import FutureMap

    prop = _Holder.__dict__["backends"]
    series = [_engine.Backport("p", "p", (3,), "p.patch", (
        _engine.Target("sglang.srt.managers.overlap_utils", "FutureMap.backends", prop, _engine.ABSENT),))]
    verdict = _engine.gate(series)
    assert verdict.decision == "patch", verdict.reason
    try:
        _engine.install(series, verdict)
        installed = FutureMap.__dict__["backends"]
        assert isinstance(installed, property)
        import sglang.srt.managers.overlap_utils as ou
        assert installed.fget.__globals__ is vars(ou)
        assert FutureMap.backends.fget(None) == ["triton"]
    finally:
        _engine.uninstall()


def _write_pkg(root, missing: str) -> None:
    """A package whose __init__ finishes one submodule, then fails on a missing dependency
    (FlashInfer 0.6.11 without cuda-tile), and a module that imports that submodule."""
    pkg = root / "halfpkg_fm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"from . import done\nimport {missing}\n")
    (pkg / "done.py").write_text("VALUE = 7\n")
    (root / "uses_halfpkg_fm.py").write_text("from halfpkg_fm.done import VALUE\n")


def test_a_chain_that_imports_on_the_second_try_is_resolved(tmp_path, monkeypatch):
    from sglang_futuremap_patch import _engine

    _write_pkg(tmp_path, "no_such_dependency_fm")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("halfpkg_fm", "halfpkg_fm.done", "uses_halfpkg_fm"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = _engine._import_target_module("uses_halfpkg_fm")
    assert module.VALUE == 7


def test_a_module_that_cannot_import_still_fails(tmp_path, monkeypatch):
    from sglang_futuremap_patch import _engine

    (tmp_path / "broken_fm.py").write_text("import no_such_dependency_fm\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_fm"):
        _engine._import_target_module("broken_fm")


def _edit_chain():
    """Two back-ports editing the same SGLang function (``fast_topk``), the second on top of
    the first: each adds one line of its own."""
    owner = "sglang.srt.utils.common"
    first = _engine.TextEdit(old="    if topk == 1:\n", new="    values = values * 2\n    if topk == 1:\n")
    second = _engine.TextEdit(old="    else:\n", new="    else:\n        values = values + 1\n")
    from sglang.srt.utils import common

    pristine = _engine.fingerprint(common.fast_topk)
    a_target = _engine.Target(owner, "fast_topk", None, pristine, kind="edit", edits=(first,))

    after_first = _engine.fingerprint(_engine.edited_function(common.fast_topk, a_target, {}))
    b_target = _engine.Target(owner, "fast_topk", None, after_first, kind="edit", edits=(second,))
    return [_engine.Backport("a", "a", (1,), "a.patch", (a_target,)),
            _engine.Backport("b", "b", (2,), "b.patch", (b_target,))]


def test_an_edit_may_follow_an_edit_of_the_same_function(clean_state, monkeypatch):
    import torch
    from sglang.srt.utils import common

    series = _edit_chain()
    stock = common.fast_topk
    verdict = _engine.gate(series)
    assert verdict.decision == "patch", verdict.reason
    try:
        _engine.install(series, verdict)
        # Both links' lines run: the first doubles, the second adds one (topk > 1 branch).
        values = torch.tensor([[1.0, 3.0, 2.0]])
        assert common.fast_topk(values, 2, -1).values.tolist() == [[7.0, 5.0]]
        assert common.fast_topk(values, 1, -1).values.tolist() == [[6.0]]
    finally:
        _engine.uninstall()
    assert common.fast_topk is stock

    # A later link that does not build on the earlier one is refused, statically.
    a, b = series
    stale = _engine.Target(b.targets[0].owner, "fast_topk", None, a.targets[0].expected, kind="edit",
                           edits=b.targets[0].edits)
    verdict = _engine.gate([a, _engine.Backport("b", "b", (2,), "b.patch", (stale,))])
    assert verdict.decision == "mismatch" and "supersedes" in verdict.reason

    # A patched tree carries both edits; one that has the first only is not that tree.
    both = _engine.edited_function(_engine.edited_function(stock, a.targets[0], {}), b.targets[0],
                                   vars(common))
    monkeypatch.setattr(common, "fast_topk", both)
    assert _engine.gate(series).decision == "upstream"
    only_first = _engine.edited_function(stock, a.targets[0], vars(common))
    monkeypatch.setattr(common, "fast_topk", only_first)
    verdict = _engine.gate(series)
    assert verdict.decision == "mismatch"
    assert [c.detail for c in verdict.checks["b"]] == ["the source lacks this link's edits"]


def test_a_later_edit_may_rewrite_a_line_an_earlier_edit_wrote(clean_state, monkeypatch):
    """The second link changes the line the first one added: a patched tree has the second
    version of that line only, and is still recognised (undoing both links gives SGLang's
    function back); a tree with the first link alone is not that tree."""
    import torch
    from sglang.srt.utils import common

    owner = "sglang.srt.utils.common"
    stock = common.fast_topk
    first = _engine.TextEdit(old="    if topk == 1:\n", new="    values = values * 2\n    if topk == 1:\n")
    a = _engine.Target(owner, "fast_topk", None, _engine.fingerprint(stock), kind="edit", edits=(first,))
    after_first = _engine.edited_function(stock, a, {})
    second = _engine.TextEdit(old="    values = values * 2\n", new="    values = values * 3  # not 2\n")
    b = _engine.Target(owner, "fast_topk", None, _engine.fingerprint(after_first), kind="edit",
                       edits=(second,))
    series = [_engine.Backport("a", "a", (1,), "a.patch", (a,)),
              _engine.Backport("b", "b", (2,), "b.patch", (b,))]
    verdict = _engine.gate(series)
    assert verdict.decision == "patch", verdict.reason
    try:
        _engine.install(series, verdict)
        values = torch.tensor([[1.0, 3.0, 2.0]])
        assert common.fast_topk(values, 1, -1).values.tolist() == [[9.0]]
    finally:
        _engine.uninstall()
    assert common.fast_topk is stock

    both = _engine.edited_function(after_first, b, vars(common))
    assert "values * 2" not in inspect.getsource(both.__code__)
    monkeypatch.setattr(common, "fast_topk", both)
    assert _engine.gate(series).decision == "upstream"
    monkeypatch.setattr(common, "fast_topk", _engine.edited_function(stock, a, vars(common)))
    verdict = _engine.gate(series)
    assert verdict.decision == "mismatch"
    assert [c.detail for c in verdict.checks["b"]] == ["the source lacks this link's edits"]


def test_an_edit_may_add_a_parameter_with_a_default(clean_state):
    """An edit that adds a parameter with a default (back-port 1's ``on_publish=None``): the
    installed function takes it, and callers that do not pass it work as before."""
    import torch
    from sglang.srt.utils import common

    edits = (_engine.TextEdit(old="def fast_topk(values, topk, dim):\n",
                              new="def fast_topk(values, topk, dim, scale=2.0, *, shift=0.0):\n"),
             _engine.TextEdit(old="    if topk == 1:\n",
                              new="    values = values * scale + shift\n    if topk == 1:\n"))
    target = _engine.Target("sglang.srt.utils.common", "fast_topk", None,
                            _engine.fingerprint(common.fast_topk), kind="edit", edits=edits)
    series = [_engine.Backport("a", "a", (1,), "a.patch", (target,))]
    _engine.install(series, _engine.gate(series))
    try:
        values = torch.tensor([[1.0, 3.0, 2.0]])
        assert common.fast_topk(values, 1, -1).values.tolist() == [[6.0]]
        assert common.fast_topk(values, 1, -1, 1.0, shift=1.0).values.tolist() == [[4.0]]
    finally:
        _engine.uninstall()


def test_every_edit_chain_of_the_series_is_recognised_once_applied(clean_state):
    """For every chain that starts with an edit of SGLang's function, the function the
    whole chain makes (what a patched tree holds) is recognised as carrying every link."""
    chains = _engine._chains(clean_state)
    checked = 0
    for path, chain in chains.items():
        if chain[0].kind != "edit":
            continue
        final = _engine.link_function(chain, len(chain) - 1, _engine._live(chain[0]))
        assert _engine.chain_in_source(final, chain) == (True, []), path
        checked += 1
    assert checked


def test_every_verdict_decision_is_one_documented_value() -> None:
    import re
    from pathlib import Path

    with pytest.raises(ValueError, match="unknown verdict decision 'bogus'"):
        _engine.Verdict("0.5.12.post1", "bogus", "")
    for decision in _engine.DECISIONS:
        assert _engine.Verdict("0.5.12.post1", decision, "").decision == decision
    # Every decision the package's code writes, by construction or by assignment, is documented.
    root = Path(_engine.__file__).parent
    written = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        written |= set(re.findall(r'Verdict\([^,()]+, "(\w+)"', text))
        written |= set(re.findall(r'decision(?:, [\w.]+)? = "(\w+)"', text))
        written |= {v for k, v in re.findall(r'^(\w+) = "(\w+)"$', text, re.M) if k == "UNAVAILABLE"}
    assert {"patch", "off", "failed", "unavailable"} <= written
    assert written <= set(_engine.DECISIONS), written - set(_engine.DECISIONS)


def test_an_edit_of_a_classmethod_stays_a_classmethod(clean_state):
    """A text edit of a classmethod (``SamplingBatchInfo.from_schedule_batch``) installs a
    classmethod that runs the edited text; any other decorator is refused."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    owner = "sglang.srt.sampling.sampling_batch_info"
    raw = inspect.getattr_static(SamplingBatchInfo, "from_schedule_batch")
    assert isinstance(raw, classmethod)
    edit = _engine.TextEdit(old="    global_server_args = get_global_server_args()\n",
                            new="    cls.edited_marker = len(batch.reqs)\n"
                                "    global_server_args = get_global_server_args()\n")
    target = _engine.Target(owner, "SamplingBatchInfo.from_schedule_batch", None,
                            _engine.fingerprint(raw), kind="edit", edits=(edit,))
    series = [_engine.Backport("c", "c", (1,), "c.patch", (target,))]
    verdict = _engine.gate(series)
    assert verdict.ok, verdict.reason
    _engine.install(series, verdict)
    try:
        installed = inspect.getattr_static(SamplingBatchInfo, "from_schedule_batch")
        assert isinstance(installed, classmethod)
        try:  # runs the edited text: the marker is set first, whatever follows
            SamplingBatchInfo.from_schedule_batch(SimpleNamespace(reqs=[1, 2]), 8)
        except Exception:
            pass
        assert SamplingBatchInfo.edited_marker == 2
    finally:
        _engine.uninstall()
        if "edited_marker" in vars(SamplingBatchInfo):
            del SamplingBatchInfo.edited_marker
    decorated = _engine.Target(owner, "x", None, "", kind="edit", edits=())
    with pytest.raises(_engine.PatchError, match="undecorated"):
        _engine.edited_function(_decorated_example, decorated, {})


def _identity(func):
    return func


@_identity
def _decorated_example():
    return 1
