"""GGUF files a user hands ``trilm import gguf``: damaged or hostile bytes get a named error, never a crash.

A tiny llama GGUF is written with ``gguf.GGUFWriter`` (F32 and Q8_0 tensors, a string array, scalars);
every property then damages it (truncation at each section boundary and at random offsets, bit flips,
absurd counts, lengths and offsets written into the fields) and demands :class:`GGUFFormatError` or
another ConfigError naming the file — and through the CLI, exit status 2 with nothing written.
"""

from __future__ import annotations

import re
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, flip, named
from trilm.cli import main
from trilm.config import ConfigError
from trilm.export.gguf_check import GGUFFormatError, check_gguf, open_gguf
from trilm.export.gguf_import import check_metadata, read_rope_scaling
from trilm.export.gguf_read import declared_config

TOKENS = ["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc"]


def write_tiny_llama(path: Path) -> Path:
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(TOKENS))
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    shapes = {"token_embd.weight": (8, 32), "output_norm.weight": (32,)}
    shapes.update({f"blk.0.{n}.weight": (32,) for n in ("attn_norm", "ffn_norm")})
    shapes.update({f"blk.0.attn_{n}.weight": (32, 32) for n in ("q", "k", "v", "output")})
    shapes.update({"blk.0.ffn_gate.weight": (64, 32), "blk.0.ffn_up.weight": (64, 32)})
    shapes["blk.0.ffn_down.weight"] = (32, 64)
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2 and "attn" in name:
            w.add_tensor(name, quants.quantize(x, T.Q8_0), raw_dtype=T.Q8_0)
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf").read_bytes()


def fields(data: bytes) -> list[tuple[str, int, str]]:
    """(label, byte offset, struct format) of every count, length, type and offset field of the file."""
    p, out = 24, [("tensor count", 8, "Q"), ("kv count", 16, "Q")]
    kv_count, tensor_count = struct.unpack_from("<Q", data, 16)[0], struct.unpack_from("<Q", data, 8)[0]
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(vtype: int, p: int, label: str) -> int:
        if vtype == 8:
            out.append((f"{label} string length", p, "Q"))
            return p + 8 + struct.unpack_from("<Q", data, p)[0]
        if vtype == 9:
            itype, n = struct.unpack_from("<IQ", data, p)
            out.extend([(f"{label} item type", p, "I"), (f"{label} array length", p + 4, "Q")])
            p += 12
            for i in range(n):
                p = value(itype, p, f"{label}[{i}]") if itype in (8, 9) else p + sizes[itype]
            return p
        return p + sizes[vtype]

    for _ in range(kv_count):
        n = struct.unpack_from("<Q", data, p)[0]
        key = data[p + 8 : p + 8 + n].decode()
        out.extend([(f"{key} key length", p, "Q"), (f"{key} value type", p + 8 + n, "I")])
        p = value(struct.unpack_from("<I", data, p + 8 + n)[0], p + 12 + n, key)
    for _ in range(tensor_count):
        n = struct.unpack_from("<Q", data, p)[0]
        name = data[p + 8 : p + 8 + n].decode()
        out.append((f"{name} name length", p, "Q"))
        p += 8 + n
        dims = struct.unpack_from("<I", data, p)[0]
        out.append((f"{name} n_dims", p, "I"))
        out.extend((f"{name} dim {d}", p + 4 + 8 * d, "Q") for d in range(dims))
        p += 4 + 8 * dims
        out.extend([(f"{name} type", p, "I"), (f"{name} offset", p + 4, "Q")])
        p += 12
    return out


def boundaries(data: bytes) -> list[int]:
    """Every section and item boundary: header, each key/value pair, each tensor info, each tensor's data."""
    layout = check_gguf_bytes(data)
    cuts = {0, 4, 8, 16, 24, layout.data_offset}
    cuts.update(offset for _, offset, _ in fields(data))
    for span in layout.tensors:
        cuts.update((span.start, span.start + span.nbytes // 2, span.start + span.nbytes - 1))
    return sorted(c for c in cuts if c < data_end(data))


def data_end(data: bytes) -> int:
    return max(s.start + s.nbytes for s in check_gguf_bytes(data).tensors)


_scratch: dict[bytes, object] = {}


def check_gguf_bytes(data: bytes):
    if data not in _scratch:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "x.gguf"
            path.write_bytes(data)
            _scratch[data] = check_gguf(path)
    return _scratch[data]


def read_everything(path: Path) -> None:
    """What ``trilm import gguf`` reads before transformers does: structure, metadata, declared model."""
    reader = open_gguf(path)
    for field in reader.fields.values():
        field.contents()
    check_metadata(reader, path)
    read_rope_scaling(reader, path)
    declared_config(reader, path)


def test_the_tiny_file_is_whole(tiny, tmp_path):
    path = tmp_path / "t.gguf"
    path.write_bytes(tiny)
    layout = check_gguf(path)
    assert layout.tensor_count == 11 and len(layout.tensors) == 11 and "tokenizer.ggml.tokens" in layout.keys
    read_everything(path)


def test_a_24_byte_header_only_file_is_named(tmp_path):
    """A header and nothing else, as a truncated download leaves it: a ConfigError naming the file, not an
    IndexError."""
    for counts in ((0, 0), (1, 0), (0, 1), (3, 5)):
        path = tmp_path / f"header-{counts[0]}-{counts[1]}.gguf"
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, *counts))
        with pytest.raises(ConfigError, match=str(path)):
            read_everything(path)


def test_a_tensor_count_of_2_to_the_60_fails_fast_without_allocating(tmp_path):
    """The second case: the count is checked against the file size before anything is sized from it."""
    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0) + bytes(4096))
    tracemalloc.start()
    try:
        with pytest.raises(GGUFFormatError, match=r"header: tensor count 1152921504606846976"):
            open_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kv count", 2**60, r"key/value count"),
        ("general.architecture key length", 2**62, r"key 0 length 4611686018427387904 runs past the end"),
        ("blk.0.attn_q.weight n_dims", 2**31, r"n_dims 2147483648; GGUF allows at most 4"),
        ("general.architecture string length", 2**40, r"general\.architecture length .* past the end"),
        ("tokenizer.ggml.tokens array length", 2**61, r"array of 2305843009213693952 items cannot fit"),
        ("output_norm.weight offset", 2**50, r"output_norm\.weight.*offset past the end"),
        ("output_norm.weight offset", 33, r"output_norm\.weight.* offset 33 is not 32-aligned"),
        ("output_norm.weight type", 999, r"ggml type 999"),
        ("general.architecture value type", 77, r"value type 77"),
    ],
)
def test_absurd_counts_lengths_and_offsets_are_named(tiny, tmp_path, field, value, message):
    at = {label: (offset, fmt) for label, offset, fmt in fields(tiny)}
    offset, fmt = at[field]
    data = bytearray(tiny)
    struct.pack_into("<" + fmt, data, offset, value)
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match=message) as info:
        open_gguf(path)
    assert str(path) in str(info.value) and "byte offset" in str(info.value)


def test_overlapping_tensor_data_is_named(tiny, tmp_path):
    at = {label: offset for label, offset, _ in fields(tiny)}
    data = bytearray(tiny)
    first = struct.unpack_from("<Q", data, at["token_embd.weight offset"])[0]
    struct.pack_into("<Q", data, at["output_norm.weight offset"], first)
    path = tmp_path / "overlap.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match=r"tensors .* overlap"):
        open_gguf(path)


def test_truncation_at_every_section_boundary_is_named(tiny, tmp_path):
    path = tmp_path / "cut.gguf"
    cuts = boundaries(tiny)
    assert len(cuts) > 60
    for cut in cuts:
        path.write_bytes(tiny[:cut])
        named(lambda: open_gguf(path), GGUFFormatError, path, must_fail=True)


@SETTINGS
@given(data=st.data())
def test_truncation_at_any_offset_is_named(tiny, tmp_path, data):
    cut = data.draw(st.integers(0, data_end(tiny) - 1))
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny[:cut])
    named(lambda: open_gguf(path), GGUFFormatError, path, must_fail=True)


@SETTINGS
@given(data=st.data())
def test_bit_flips_are_read_or_named(tiny, tmp_path, data):
    header_bits = check_gguf_bytes(tiny).data_offset * 8
    bit = st.one_of(st.integers(0, header_bits - 1), st.integers(0, data_end(tiny) * 8 - 1))
    bits = data.draw(st.lists(bit, min_size=1, max_size=3))
    damaged = tiny
    for bit in bits:
        damaged = flip(damaged, bit)
    path = tmp_path / "flipped.gguf"
    path.write_bytes(damaged)
    named(lambda: read_everything(path), ConfigError, path, must_fail=False)


@SETTINGS
@given(data=st.data())
def test_any_value_in_any_count_or_length_field_is_read_or_named(tiny, tmp_path, data):
    _, offset, fmt = data.draw(st.sampled_from(fields(tiny)))
    width = 8 * struct.calcsize(fmt)
    value = data.draw(
        st.one_of(
            st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**60, 2**62, 2**width - 1]),
            st.integers(0, 2**width - 1),
        )
    )
    damaged = bytearray(tiny)
    struct.pack_into("<" + fmt, damaged, offset, value % 2**width)
    path = tmp_path / "absurd.gguf"
    path.write_bytes(bytes(damaged))
    named(lambda: read_everything(path), ConfigError, path, must_fail=False)


def _cli(path: Path, out: Path, capsys) -> str:
    assert main(["import", "gguf", str(path), str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "Traceback" not in err
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []
    return err


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 0), r"no general\.architecture"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1, 0), r"header: tensor count 1 .* cannot fit"),
        (b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0), r"header: tensor count 1152921504606846976"),
        (b"", r"empty"),
        (b"GGUF\x03\x00", r"shorter than the 24-byte GGUF header"),
        (b"GGML" + bytes(40), r"magic b'GGML' is not b'GGUF'"),
    ],
)
def test_the_cli_exits_2_and_writes_nothing(tmp_path, capsys, header, message):
    path = tmp_path / "in.gguf"
    path.write_bytes(header)
    assert re.search(message, _cli(path, tmp_path / "snap", capsys))


@SETTINGS
@given(data=st.data())
def test_the_cli_answers_damaged_files_with_exit_2_and_no_output(tiny, tmp_path, capsys, data):
    cut = data.draw(st.sampled_from(boundaries(tiny)))
    path = tmp_path / "cli.gguf"
    path.write_bytes(tiny[:cut])
    err = _cli(path, tmp_path / "snap", capsys)
    assert re.search(r": (header|metadata|tensor infos|tensor data): ", err), err
