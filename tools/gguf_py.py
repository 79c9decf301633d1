"""A small, self-contained GGUF v3 writer and reader (numpy only).

Written from the GGUF specification; it does not use the `gguf` package. Only what the
Sextant test models need is supported: metadata of every scalar type, strings and arrays,
and tensors of type F32, F16 and Q8_0.

Layout (all little-endian):
    magic "GGUF" | version u32 = 3 | tensor_count u64 | metadata_kv_count u64
    metadata kv*: key string | value type u32 | value
    tensor info*: name string | n_dims u32 | dims u64 * n_dims | ggml type u32 | offset u64
    padding to general.alignment
    tensor data, each tensor starting at a multiple of the alignment (offsets are relative to
    the start of the data section)
A string is a u64 byte length followed by UTF-8 bytes (no terminator). An array value is
u32 element type, u64 count, then the elements. dims[0] is the innermost (contiguous)
dimension, so a row-major numpy array of shape [rows, cols] is described by dims [cols, rows].
"""

import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

_SCALAR_FORMAT = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}

# ggml tensor types.
GGML_F32 = 0
GGML_F16 = 1
GGML_Q8_0 = 8
GGML_TYPE_NAME = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q8_0: "Q8_0"}

QK8_0 = 32                  # values per Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0  # fp16 scale + 32 int8


class Meta:
    """A metadata value with an explicit GGUF type (arrays: elem_type is the element type)."""

    def __init__(self, vtype, value, elem_type=None):
        self.vtype = vtype
        self.value = value
        self.elem_type = elem_type

    def __repr__(self):
        return f"Meta({self.vtype}, {self.value!r}, {self.elem_type})"


# --------------------------------------------------------------------------------------------
# Q8_0
# --------------------------------------------------------------------------------------------

def quantize_q8_0(x):
    """Quantise a float32 array (last dimension a multiple of 32) to Q8_0 bytes.

    Mirrors llama.cpp's quantize_row_q8_0_ref bit for bit: per block of 32 consecutive
    values of a row, d = max|x| / 127 (float32), id = 1/d (0 if d == 0), q = roundf(x * id)
    (round half away from zero), stored as fp16(d) followed by 32 int8.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.shape[-1] % QK8_0 == 0, x.shape
    blocks = x.reshape(-1, QK8_0)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    scaled = (blocks * inv[:, None]).astype(np.float32)
    q = (np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))).astype(np.int8)  # roundf
    out = np.empty((blocks.shape[0], Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def dequantize_q8_0(raw, shape):
    """Inverse of quantize_q8_0: bytes -> float32 array of the given numpy shape."""
    n = int(np.prod(shape))
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(n // QK8_0, Q8_0_BLOCK_BYTES)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(shape)


def tensor_nbytes(ggml_type, n_elements):
    if ggml_type == GGML_F32:
        return 4 * n_elements
    if ggml_type == GGML_F16:
        return 2 * n_elements
    if ggml_type == GGML_Q8_0:
        assert n_elements % QK8_0 == 0
        return n_elements // QK8_0 * Q8_0_BLOCK_BYTES
    raise ValueError(f"unsupported ggml type {ggml_type}")


def encode_tensor(array, ggml_type):
    """numpy float array -> raw bytes of the given ggml type."""
    array = np.asarray(array, dtype=np.float32)
    if ggml_type == GGML_F32:
        return array.astype("<f4").tobytes()
    if ggml_type == GGML_F16:
        return array.astype("<f2").tobytes()
    if ggml_type == GGML_Q8_0:
        return quantize_q8_0(array)
    raise ValueError(f"unsupported ggml type {ggml_type}")


def decode_tensor(raw, ggml_type, shape):
    """raw bytes -> float32 numpy array of the given (numpy-order) shape."""
    if ggml_type == GGML_F32:
        return np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)
    if ggml_type == GGML_F16:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if ggml_type == GGML_Q8_0:
        return dequantize_q8_0(raw, shape)
    raise ValueError(f"unsupported ggml type {ggml_type}")


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------

def _pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value, elem_type=None):
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        assert elem_type is not None and elem_type != ARRAY
        parts = [struct.pack("<IQ", elem_type, len(value))]
        if elem_type == STRING:
            parts += [_pack_string(v) for v in value]
        else:
            parts.append(np.asarray(value, dtype=np.dtype(_SCALAR_FORMAT[elem_type])).tobytes())
        return b"".join(parts)
    return struct.pack(_SCALAR_FORMAT[vtype], value)


def _align(n, alignment):
    return (n + alignment - 1) // alignment * alignment


def write_gguf(path, metadata, tensors, alignment=DEFAULT_ALIGNMENT):
    """Write a GGUF v3 file.

    metadata: dict key -> Meta (insertion order is kept).
    tensors:  list of (name, numpy float array in row-major numpy order, ggml type).
    """
    header = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata))]
    for key, meta in metadata.items():
        header.append(_pack_string(key))
        header.append(struct.pack("<I", meta.vtype))
        header.append(_pack_value(meta.vtype, meta.value, meta.elem_type))

    blobs = []
    offset = 0
    for name, array, ggml_type in tensors:
        dims = list(reversed(array.shape))  # ne[0] is the innermost dimension
        raw = encode_tensor(array, ggml_type)
        assert len(raw) == tensor_nbytes(ggml_type, array.size)
        offset = _align(offset, alignment)
        header.append(_pack_string(name))
        header.append(struct.pack("<I", len(dims)))
        header.append(struct.pack(f"<{len(dims)}Q", *dims))
        header.append(struct.pack("<IQ", ggml_type, offset))
        blobs.append((offset, raw))
        offset += len(raw)

    head = b"".join(header)
    data_start = _align(len(head), alignment)
    with open(path, "wb") as f:
        f.write(head)
        f.write(b"\0" * (data_start - len(head)))
        pos = 0
        for off, raw in blobs:
            f.write(b"\0" * (off - pos))
            f.write(raw)
            pos = off + len(raw)
        f.write(b"\0" * (_align(pos, alignment) - pos))  # pad the file end as well


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------

class _Cursor:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, fmt):
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return vals if len(vals) > 1 else vals[0]

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            elem_type, count = self.take("<I"), self.take("<Q")
            if elem_type == STRING:
                return Meta(ARRAY, [self.string() for _ in range(count)], elem_type)
            dt = np.dtype(_SCALAR_FORMAT[elem_type])
            arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
            self.pos += dt.itemsize * count
            return Meta(ARRAY, arr.tolist(), elem_type)
        return self.take(_SCALAR_FORMAT[vtype])


class GGUFTensor:
    def __init__(self, name, dims, ggml_type, offset, raw):
        self.name = name
        self.dims = dims            # GGUF order: dims[0] innermost
        self.ggml_type = ggml_type
        self.offset = offset        # relative to the data section
        self.raw = raw

    @property
    def shape(self):                # numpy order
        return tuple(reversed(self.dims))

    def numpy(self):
        return decode_tensor(self.raw, self.ggml_type, self.shape)


def read_gguf(path):
    """Read a GGUF v3 file. Returns (metadata: dict key -> Meta, tensors: dict name -> GGUFTensor)."""
    with open(path, "rb") as f:
        buf = f.read()
    c = _Cursor(buf)
    assert buf[:4] == GGUF_MAGIC, "bad magic"
    c.pos = 4
    version, n_tensors, n_kv = c.take("<IQQ")
    assert version == GGUF_VERSION, version
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        vtype = c.take("<I")
        v = c.value(vtype)
        metadata[key] = v if isinstance(v, Meta) else Meta(vtype, v)
    alignment = metadata["general.alignment"].value if "general.alignment" in metadata else DEFAULT_ALIGNMENT
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        dims = [c.take("<Q") for _ in range(n_dims)]
        ggml_type, offset = c.take("<IQ")
        infos.append((name, dims, ggml_type, offset))
    data_start = _align(c.pos, alignment)
    tensors = {}
    for name, dims, ggml_type, offset in infos:
        assert offset % alignment == 0, (name, offset)
        n = tensor_nbytes(ggml_type, int(np.prod(dims)))
        start = data_start + offset
        assert start + n <= len(buf), f"tensor {name} runs past the end of the file"
        tensors[name] = GGUFTensor(name, dims, ggml_type, offset, buf[start:start + n])
    return metadata, tensors
