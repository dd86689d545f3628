"""The corpus builder's pure parts: HTML → visible text, and the stratified split assignment."""

from __future__ import annotations

from train.build_corpus import HOLDOUT_EVERY, Doc, html_text, select

PAGE = """<html><head><title>T</title><style>p {color: red}</style></head><body>
<div class="nosearch"><a href="index.html">Home</a> menu</div>
<script>var x = 1;</script>
<div role="main"><h1>Queues<a class="headerlink" href="#q">¶</a></h1>
<p>A first in,   first out
queue &amp; more.</p><pre>for x in q:
    print(x)</pre><ul><li>one</li><li>two</li></ul></div></body></html>"""


def test_html_text_keeps_visible_prose_and_code_layout(tmp_path):
    page = tmp_path / "p.html"
    page.write_text(PAGE)
    main = html_text(page, root_attr=("role", "main"), skip_classes={"headerlink"})
    assert (
        main == "Queues\n\nA first in, first out queue & more.\n\nfor x in q:\n    print(x)\n\none\n\ntwo\n"
    )
    whole = html_text(page, skip_classes={"nosearch"})
    assert "menu" not in whole and "var x" not in whole and "color" not in whole and "Queues¶" not in whole
    assert whole.startswith("Queues")


def test_select_holds_out_documents_of_every_source():
    docs = [Doc(f"{s}/{i}", s, "x" * 100) for s in ("RedPajamaBook", "RedPajamaGithub") for i in range(100)]
    splits = select(docs)
    for source in ("RedPajamaBook", "RedPajamaGithub"):
        held = [d for split in ("validation", "test") for d in splits[split] if d.source == source]
        assert len(held) == 2 * (100 // HOLDOUT_EVERY)
    assert sum(len(v) for v in splits.values()) == 200
    assert select(list(reversed(docs))) == splits  # depends on content hashes, not input order
