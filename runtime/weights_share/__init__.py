"""Copy a layer range's weights from a peer over the ``weights`` data channel, verified.

A device that joins a room can take the tensors of its layer range from a peer that
already holds them instead of converting or reading the model again. Everything it
receives is checked against a sha256 manifest before a single byte is written.

API::

    m = make_manifest(model_dir, start, end, with_embedding, with_head)   # dict, see below
    server = serve_weights(transport, model_dir, holds=None, grant=None)  # answers requests
    path = await fetch_range(transport, peer, start, end, with_embedding, with_head,
                             dest_dir, expected_manifest)                 # -> dest_dir/model.safetensors
    load_range(dest_dir, start, end, with_embedding, with_head)           # runtime.weights, as is

Layer ranges are 0-based half-open ``[start, end)`` as in :mod:`runtime.weights`.

The manifest (JSON-able dict)::

    {"version": 1, "start": 0, "end": 15, "embedding": true, "head": true,
     "tensors": {NAME: {"sha256": HEX, "dtype": "F32", "shape": [576, 576],
                        "nbytes": 1327104}, ...},
     "files":   {"config.json": {"sha256": HEX, "nbytes": 763}, ...},
     "sha256":  HEX}   # sha256 of the canonical JSON of everything else (sorted keys,
                       # no spaces), so one 64-character string pins the whole range

``files`` holds ``config.json`` always and the tokenizer files when the range has the
embedding (a model host's directory), so ``dest_dir`` becomes a complete model
directory for that range: :func:`runtime.backends.make_stage` and
:func:`runtime.weights.load_range` read it unchanged.

Wire protocol (every message on the ``weights`` channel; little endian)::

    kind u8 ('Q' request, 'R' reply) | header_len u32 | header JSON (UTF-8) | payload bytes

Requests carry no payload: ``{"id": N, "op": "manifest", "start", "end", "embedding",
"head"}`` (``"host": true`` stands for embedding and head), ``{"id", "op": "tensor",
"name", "offset", "length"}`` (a byte slice of one tensor, at most
``MAX_PART_BYTES``) and ``{"id", "op": "file", "name"}``. A tensor request may add
``"form": "packed"``: the slice is then of the tensor's packed form (lossless, about
5.3x smaller for float32 weights dequantized from 4-bit GGUF blocks; see
:mod:`runtime.weights_codec`) when it has one, and of the stored bytes when not; the
reply's ``form`` (``packed`` or ``raw``) and ``total`` (bytes of that form) say which.
A reply's header is ``{"id", "ok": true, ...}`` followed by the bytes (manifest JSON,
tensor slice, file), or ``{"id", "ok": false, "error": "..."}``. A server refuses (``ok: false``) any tensor
or range it does not hold (or, with a ``grant``, that the asking peer is not granted),
malformed requests, and files other than the model directory's config and tokenizer
files. Replies to one peer may come in another order than its requests: match them by
``id``.

Speakers: :func:`fetch_range` here, and a browser tab that holds layers
(runtime/serve/static/tab_worker.js ``fetchRange``: the same requests, the packed form
unpacked in JavaScript, each tensor's sha256 checked with WebCrypto), served by the model
host's :class:`runtime.serve.tab_stage.TabRoom` with a ``grant`` of the tab's range.

A room holding a GGUF's blocks as stored (``weights: gguf``) passes ``blocks=True`` to
:func:`make_manifest`, :func:`serve_weights` and :func:`range_nbytes`: the tensors are
then the GGUF file's own bytes (GGML types such as ``Q4_K``, shapes ``[out, in]``, each
entry naming its GGUF tensor; :mod:`runtime.weights_share.manifest`), and
:func:`fetch_range` writes them as ``dest_dir/blocks.gguf-data`` with the table
``dest_dir/gguf.json``, which ``runtime.weights.load_range_native`` reads.

Packed copies exist because the transport is CPU-bound (aiortc's SCTP in Python,
about 2 MB/s here, docs/transport.md): a recovering device's 14.2 MB layer takes 7 s
raw and 1.4 s packed.

Pacing: the transport hands ``weights`` messages to SCTP in 16 KiB pieces behind
residuals and replies, with a cap on bytes in flight (docs/transport.md), so a copy
never holds a residual back for more than one piece. The client keeps ``window``
slices of ``part_bytes`` (default 4 x 1 MiB) requested at a time.

Receiving: :func:`serve_weights` subscribes to the requests on the ``weights`` channel
(``Transport.subscribe``), :func:`fetch_range`, while it runs, to the replies from the
peer it asks; neither touches the transport's handler, so they run beside a
:class:`runtime.room.Node` (whose handler gets every message they do not take) in any
order, and a server closed or a copy ended takes nothing more.

Three modules: :mod:`runtime.weights_share.manifest` (making a range's manifest from a
model directory, checking one from a peer, the range's stored bytes),
:mod:`runtime.weights_share.wire` (the channel's message format) and
:mod:`runtime.weights_share.peers` (the IO: :class:`WeightsServer` and
:func:`fetch_range`). This package's names are theirs.
"""

from .manifest import (CONFIG_FILES, HOST_FILES, MANIFEST_VERSION, MAX_DIMS, MAX_RANGE_BYTES, MAX_TENSOR_BYTES,
                       MAX_TENSORS, WeightsError, expected_sha256, make_manifest, manifest_sha256, range_nbytes)
from .peers import PART_BYTES, WINDOW, WeightsServer, fetch_range, serve_weights
from .wire import CHANNEL, MAX_HEADER_BYTES, MAX_PART_BYTES, decode, encode

__all__ = ["CHANNEL", "CONFIG_FILES", "HOST_FILES", "MANIFEST_VERSION", "MAX_DIMS", "MAX_HEADER_BYTES",
           "MAX_PART_BYTES", "MAX_RANGE_BYTES", "MAX_TENSORS", "MAX_TENSOR_BYTES", "PART_BYTES", "WINDOW",
           "WeightsError", "WeightsServer", "decode", "encode", "expected_sha256", "fetch_range", "make_manifest",
           "manifest_sha256", "range_nbytes", "serve_weights"]
