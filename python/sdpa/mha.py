"""MultiheadAttention: torch.nn.MultiheadAttention's forward over numpy arrays (sdpa_mha_forward),
with the weights of a PyTorch state_dict."""
import ctypes

import numpy as np

from . import _lib
from ._arrays import as_numpy, is_bf16, kind_of, new_array, wrap
from ._errors import py_error
from ._views import (attach_vector, attach_view, choice, int32, integer, is_additive, mask_view,
                     real, split_axis, tensor_view, uint64)
from .attention import EMPTY_ROWS
from .masks import allow_from_ignore

__all__ = ["MultiheadAttention", "STATE_DICT_KEYS"]

#: The keys of torch.nn.MultiheadAttention.state_dict() (those present depend on the layer).
STATE_DICT_KEYS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                   "in_proj_bias", "bias_k", "bias_v", "out_proj.weight", "out_proj.bias")

# state_dict key -> sdpa_mha_params field
_PARAM_FIELDS = {
    "in_proj_weight": "in_proj_weight",
    "q_proj_weight": "q_proj_weight",
    "k_proj_weight": "k_proj_weight",
    "v_proj_weight": "v_proj_weight",
    "in_proj_bias": "in_proj_bias",
    "bias_k": "bias_k",
    "bias_v": "bias_v",
    "out_proj.weight": "out_proj_weight",
    "out_proj.bias": "out_proj_bias",
}


def _to_numpy(value, key):
    """A float32 numpy array from a numpy array, a torch tensor (CPU, any strides) or another
    array (_arrays.as_numpy). float32 arrays are kept as given (no copy, any strides: later
    in-place changes to the module's parameters are seen); other float dtypes are converted
    once, here."""
    if not isinstance(value, np.ndarray) and (kind_of(value) == "torch" or hasattr(value, "__dlpack__")
                                              or hasattr(value, "__array_interface__")):
        array = as_numpy(value, f"state_dict[{key!r}]")
    else:
        array = np.asarray(value)
    if is_bf16(array.dtype):  # bfloat16 bits are the high half of a float32
        return (array.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if array.dtype.kind != "f":
        raise py_error("SDPA_ERR_DTYPE", f"state_dict[{key!r}] has dtype {array.dtype}, expected float")
    if array.dtype != np.float32:
        array = array.astype(np.float32)
    return array


def _float32_mask(mask, name):
    """An additive MHA mask as float32 (sdpa_mha_forward computes float32 only): float16 and
    bfloat16 masks are widened exactly (a copy of the mask); float32 is used as given."""
    if mask.dtype == np.float32:
        return mask
    if mask.dtype == np.float16:
        return mask.astype(np.float32)
    if is_bf16(mask.dtype):  # bfloat16 bits are the high half of a float32
        return (mask.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise py_error("SDPA_ERR_DTYPE", f"a float {name} must be float32, float16 or bfloat16, got {mask.dtype}")


def _check_dropout(p, name="dropout"):
    """A dropout probability as torch accepts it: a real number in [0, 1]."""
    p = real(p, name)
    if not 0.0 <= p <= 1.0:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name}={p} must be in [0, 1] (a probability, as torch.nn.MultiheadAttention's)")
    return p


def _check_mask_dtype(mask, name):
    """MultiheadAttention masks are bool (True = IGNORE) or float (additive), as in
    torch.nn.MultiheadAttention, which rejects other dtypes. An integer mask is refused rather
    than read as an ignore-mask: a Hugging Face attention_mask (1 = keep) would flip polarity."""
    if mask.dtype == np.bool_ or mask.dtype.kind == "f" or is_bf16(mask.dtype):
        return
    raise py_error("SDPA_ERR_DTYPE",
                   f"{name}.dtype={mask.dtype}, expected bool (True = ignore the key, as "
                   "torch.nn.MultiheadAttention) or float32 (additive, 0 / -inf); an integer "
                   "mask's polarity is ambiguous: a keep-mask (1 = attend, Hugging Face "
                   "attention_mask) converts with ~sdpa.allow_from_keep_int(mask), an "
                   "ignore-mask (nonzero = ignore) with mask.astype(bool)")


class MultiheadAttention:
    """torch.nn.MultiheadAttention in numpy, computed by libsdpa (sdpa_mha_forward).

    Constructor arguments as PyTorch's (embed_dim, num_heads, dropout, bias, add_bias_kv,
    add_zero_attn, kdim, vdim, batch_first, device: None or "cpu", dtype: None or float32;
    dropout in [0, 1], used only when training, where 1 is refused), plus num_kv_heads (GQA/MQA: H % num_kv_heads
    == 0) and head_dim (default embed_dim // num_heads) for Llama-style layers, which take
    separate q/k/v_proj_weight of shapes [H*Dh, E], [Hkv*Dh, kdim], [Hkv*Dh, vdim] and
    out_proj.weight [E, H*Dh]. Load the weights with load_state_dict() (or pass state_dict=),
    or build everything from a state_dict with MultiheadAttention.from_state_dict().

    Weights are numpy arrays named as in PyTorch's state_dict() (torch tensors are accepted
    too); float32 arrays are used as given, without a copy, so later in-place changes to them
    are seen; other float dtypes are converted once when loading.

    Attributes: ``training`` (False by default, unlike a fresh torch module: this class is
    meant for inference; ``train()``/``eval()`` set it), ``dropout`` (probability, used only
    when training), ``dropout_seed`` and ``dropout_offset`` (the deterministic dropout stream;
    the offset advances by one after each call that drops), ``num_threads`` (0 = online CPUs),
    ``batch_first``.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, num_kv_heads=None, head_dim=None, state_dict=None, num_threads=0):
        if device is not None and str(device) != "cpu":
            raise py_error("SDPA_ERR_UNSUPPORTED", f"device={device!r}: libsdpa computes on the CPU "
                           "(None or 'cpu')")
        if dtype is not None and str(dtype) not in ("float32", "torch.float32", "<class 'numpy.float32'>"):
            raise py_error("SDPA_ERR_DTYPE", f"dtype={dtype!r}: sdpa_mha_forward computes float32 "
                           "(None, torch.float32 or numpy.float32)")
        self.embed_dim = integer(embed_dim, "embed_dim")
        self.num_heads = integer(num_heads, "num_heads")
        if self.embed_dim <= 0 or self.num_heads <= 0:
            raise py_error("SDPA_ERR_SHAPE", f"embed_dim={embed_dim} and num_heads={num_heads} must be >= 1")
        self.kdim = self.embed_dim if kdim is None else integer(kdim, "kdim")
        self.vdim = self.embed_dim if vdim is None else integer(vdim, "vdim")
        self.num_kv_heads = (self.num_heads if num_kv_heads is None
                             else integer(num_kv_heads, "num_kv_heads"))
        if head_dim is None:
            if self.embed_dim % self.num_heads:
                raise py_error("SDPA_ERR_SHAPE",
                               f"embed_dim={self.embed_dim} must be divisible by num_heads={self.num_heads}")
            head_dim = self.embed_dim // self.num_heads
        self.head_dim = integer(head_dim, "head_dim")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise py_error("SDPA_ERR_SHAPE",
                           f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        self.bias = bool(bias)
        self.add_bias_kv = bool(add_bias_kv)
        self.add_zero_attn = bool(add_zero_attn)
        self.batch_first = bool(batch_first)
        self.dropout = _check_dropout(dropout)
        self.training = False
        self.dropout_seed = 0
        self.dropout_offset = 0
        self.num_threads = int32(num_threads, "num_threads", minimum=0)
        self._weights = {}
        if state_dict is not None:
            self.load_state_dict(state_dict)

    # ------------------------------------------------------------------ configuration
    @property
    def _qkv_same_embed_dim(self):
        """Whether PyTorch would pack the projections into in_proj_weight."""
        return (self.kdim == self.embed_dim and self.vdim == self.embed_dim
                and self.num_kv_heads == self.num_heads
                and self.head_dim * self.num_heads == self.embed_dim)

    def _expected_shapes(self, packed):
        e, dq = self.embed_dim, self.num_heads * self.head_dim
        dkv = self.num_kv_heads * self.head_dim
        shapes = {"out_proj.weight": (e, dq)}
        if packed:
            shapes["in_proj_weight"] = (3 * e, e)
        else:
            shapes.update({"q_proj_weight": (dq, e), "k_proj_weight": (dkv, self.kdim),
                           "v_proj_weight": (dkv, self.vdim)})
        if self.bias:
            shapes["in_proj_bias"] = (dq + 2 * dkv,)
            shapes["out_proj.bias"] = (e,)
        if self.add_bias_kv:
            shapes["bias_k"] = (1, 1, dkv)
            shapes["bias_v"] = (1, 1, dkv)
        return shapes

    def expected_state_dict_keys(self):
        """The keys torch.nn.MultiheadAttention.state_dict() has for this configuration."""
        return tuple(self._expected_shapes(self._qkv_same_embed_dim))

    @classmethod
    def from_state_dict(cls, state_dict, num_heads, *, batch_first=False, dropout=0.0,
                        add_zero_attn=False, num_kv_heads=None, head_dim=None, num_threads=0):
        """A layer whose embed_dim, kdim, vdim, bias and add_bias_kv are read off the
        state_dict's keys and shapes (add_zero_attn, num_heads and GQA sizes are not
        recorded in a state_dict: give them)."""
        sd = dict(state_dict)
        if "out_proj.weight" not in sd:
            raise KeyError("state_dict has no 'out_proj.weight'")
        ow = np.shape(sd["out_proj.weight"])
        embed_dim, dq = int(ow[0]), int(ow[1])
        if head_dim is None and dq != embed_dim:
            head_dim = dq // int(num_heads)
        kdim = vdim = None
        if "in_proj_weight" not in sd and "k_proj_weight" in sd and "v_proj_weight" in sd:
            kdim = int(np.shape(sd["k_proj_weight"])[1])
            vdim = int(np.shape(sd["v_proj_weight"])[1])
            dkv = int(np.shape(sd["k_proj_weight"])[0])
            hd = head_dim if head_dim is not None else embed_dim // int(num_heads)
            if num_kv_heads is None and hd and dkv != dq:
                num_kv_heads = dkv // hd
        layer = cls(embed_dim, num_heads, dropout=dropout, bias="in_proj_bias" in sd,
                    add_bias_kv="bias_k" in sd, add_zero_attn=add_zero_attn, kdim=kdim,
                    vdim=vdim, batch_first=batch_first, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, num_threads=num_threads)
        layer.load_state_dict(sd)
        return layer

    @classmethod
    def from_torch(cls, module, *, num_threads=0):
        """A layer with the configuration and the weights of a torch.nn.MultiheadAttention
        module (duck-typed: torch is not imported). The weights are the module's own float32
        parameters, viewed without a copy (later in-place updates to them are seen; other
        dtypes are converted once). The layer takes the module's mode (module.training) and
        dropout, so in eval mode from_torch(m)(x, x, x) computes what m(x, x, x) does; when
        training, the dropped weights come from libsdpa's own deterministic stream (not
        torch's) and the returned weights are the pre-dropout ones."""
        needed = ("embed_dim", "num_heads", "dropout", "batch_first", "add_zero_attn", "kdim",
                  "vdim", "in_proj_bias", "bias_k", "out_proj", "state_dict")
        missing = [a for a in needed if not hasattr(module, a)]
        if missing:
            raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got "
                            f"{type(module).__name__} without {', '.join(missing)}")
        sd = {k: v.detach() if hasattr(v, "detach") else v
              for k, v in module.state_dict(keep_vars=True).items()}
        layer = cls(module.embed_dim, module.num_heads, dropout=module.dropout,
                    bias=module.in_proj_bias is not None, add_bias_kv=module.bias_k is not None,
                    add_zero_attn=module.add_zero_attn, kdim=module.kdim, vdim=module.vdim,
                    batch_first=module.batch_first, num_threads=num_threads)
        layer.load_state_dict(sd)
        layer.training = bool(getattr(module, "training", False))
        return layer

    def load_state_dict(self, state_dict, strict=True):
        """Load weights named as in torch.nn.MultiheadAttention.state_dict(). With packed
        projections possible (kdim = vdim = embed_dim, no GQA), in_proj_weight or the three
        separate q/k/v_proj_weight are accepted. strict=True: unexpected or missing keys raise
        KeyError (as torch's load_state_dict raises); shapes are checked either way
        (SdpaShapeError)."""
        sd = {k: v for k, v in dict(state_dict).items() if v is not None}
        packed = "in_proj_weight" in sd or (self._qkv_same_embed_dim and "q_proj_weight" not in sd)
        shapes = self._expected_shapes(packed)
        unexpected = sorted(k for k in sd if k not in shapes)
        missing = sorted(k for k in shapes if k not in sd)
        if strict and (unexpected or missing):
            raise KeyError("error loading MultiheadAttention state_dict: "
                           f"missing keys {missing}, unexpected keys {unexpected} "
                           f"(expected {sorted(shapes)})")
        required = [k for k in ("out_proj.weight", "in_proj_weight", "q_proj_weight",
                                "k_proj_weight", "v_proj_weight") if k in shapes]
        absent = [k for k in required if k not in sd]
        if absent:
            raise KeyError(f"state_dict lacks {absent}")
        weights = {}
        for key, shape in shapes.items():
            if key not in sd:
                continue
            array = _to_numpy(sd[key], key)
            if key in ("bias_k", "bias_v"):
                ok = array.ndim >= 1 and array.size == shape[-1] and array.shape[-1] == shape[-1]
            else:
                ok = array.shape == shape
            if not ok:
                raise py_error("SDPA_ERR_SHAPE",
                               f"state_dict[{key!r}] has shape {array.shape}, expected {shape}")
            weights[key] = array
        if ("bias_k" in weights) != ("bias_v" in weights):
            raise KeyError("bias_k and bias_v go together (add_bias_kv)")
        self._weights = weights

    def state_dict(self):
        """The loaded weights as a dict (the arrays themselves, not copies)."""
        return dict(self._weights)

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def __repr__(self):
        extra = ""
        if self.num_kv_heads != self.num_heads:
            extra = f", num_kv_heads={self.num_kv_heads}"
        return (f"MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}"
                f"{extra}, kdim={self.kdim}, vdim={self.vdim}, batch_first={self.batch_first})")

    # ---------------------------------------------------------------------------- forward
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False, *,
                key_lengths=None, query_lengths=None, empty_rows="error"):
        """(attn_output, attn_weights or None), as torch.nn.MultiheadAttention.forward.

        query [L, B, E] (batch_first=False, the default) or [B, L, E]; key [S, B, kdim] /
        [B, S, kdim]; value likewise with vdim; unbatched [L, E] / [S, kdim] inputs too. Any
        strides, float32, no copies (the [L, B, E] layout is read through strides).
        key_padding_mask [B, S]: bool True = IGNORE that key (PyTorch's polarity), or float
            additive (float32, or float16 / bfloat16 widened exactly; added to the scores also
            beside a bool attn_mask, as torch 2.x: 1.13 read nonzero floats as IGNORE).
        attn_mask [L, S] or [B*num_heads, L, S]: bool True = IGNORE (PyTorch MHA's polarity),
            or float additive (0 / -inf; float32, float16 or bfloat16). Bool masks are
            converted with allow_from_ignore. Integer masks (uint8 included) raise
            SdpaDtypeError, as torch 2.x rejects them (1.13 took uint8 with a deprecation
            warning): their polarity is ambiguous (a Hugging Face 1 = keep mask is the
            opposite of IGNORE).
        is_causal: True applies the causal (top-left) rule itself, with or without attn_mask
            (PyTorch treats it as a hint that attn_mask is causal: the results agree).
        need_weights: return the attention probabilities, [B, L, S'] averaged over heads
            (average_attn_weights=True) or [B, H, L, S'], S' = S + add_bias_kv + add_zero_attn
            (unbatched: without B). Pre-dropout when training.
        key_lengths / query_lengths ([B] ints, right padding) and empty_rows ("error", or
            "zero" for rows that no key may reach; PyTorch gives NaN there) are extras.
        Output: attn_output of the query's layout ([L, B, E] or [B, L, E]).
        """
        lib = _lib.get()
        if not self._weights:
            raise py_error("SDPA_ERR_NULL_POINTER", "no weights loaded: call load_state_dict() first")
        like = kind_of(query)  # results: torch tensors for torch inputs, else numpy arrays
        query, key, value = (as_numpy(query, "query"), as_numpy(key, "key"),
                             as_numpy(value, "value"))
        for name, a in (("query", query), ("key", key), ("value", value)):
            if a.ndim not in (2, 3):
                raise py_error("SDPA_ERR_RANK",
                               f"{name}.ndim={a.ndim}, expected 3 (batched) or 2 (unbatched)")
        batched = query.ndim == 3
        if key.ndim != query.ndim or value.ndim != query.ndim:
            raise py_error("SDPA_ERR_RANK",
                           f"query.ndim={query.ndim}, key.ndim={key.ndim}, value.ndim={value.ndim} must be equal")
        self._check_shapes(query, key, value, batched)
        if not batched:
            q, k, v = query[None], key[None], value[None]
        elif self.batch_first:
            q, k, v = query, key, value
        else:  # [L, B, E] buffers seen as [B, L, E] views
            q, k, v = (x.transpose(1, 0, 2) for x in (query, key, value))
        B, L = q.shape[0], q.shape[1]
        S = k.shape[1]
        f32 = dict(float32_only="sdpa_mha_forward", origin=like)  # for the dtype error's hint
        tq, tk, tv = (tensor_view(q, "query", **f32), tensor_view(k, "key", **f32),
                      tensor_view(v, "value", **f32))

        if not batched or self.batch_first:
            out_view, out_user = new_array((B, L, self.embed_dim), np.dtype(np.float32), like)
        else:
            out_np, out_user = new_array((L, B, self.embed_dim), np.dtype(np.float32), like)
            out_view = out_np.transpose(1, 0, 2)
        tout = tensor_view(out_view, "attn_output", writable=True)

        s_total = S + (1 if "bias_k" in self._weights else 0) + (1 if self.add_zero_attn else 0)
        weights = tw = None
        if need_weights:
            shape = (B, L, s_total) if average_attn_weights else (B, self.num_heads, L, s_total)
            weights = np.empty(shape, dtype=np.float32)
            tw = tensor_view(weights, "attn_weights", writable=True)

        params, param_views = self._params(lib)

        opt = _lib.SdpaMhaOptions()
        lib.sdpa_mha_options_init_sized(opt, ctypes.sizeof(opt))
        allow_mask = kpm_allow = bias_arr = None
        # key_padding_mask: bool = ignore -> allow-mask [B, S]; float = additive [B, 1, 1, S].
        if key_padding_mask is not None:
            kpm = as_numpy(key_padding_mask, "key_padding_mask")
            kpm = kpm if batched else kpm[None]
            _check_mask_dtype(kpm, "key_padding_mask")
            if is_additive(kpm, "key_padding_mask"):
                kpm = _float32_mask(kpm, "key_padding_mask")
                if kpm.ndim != 2:
                    raise py_error("SDPA_ERR_SHAPE",
                                   f"key_padding_mask has shape {kpm.shape}, expected [B, S]")
                bias_arr = kpm[:, None, None, :]
            else:
                kpm_allow = allow_from_ignore(kpm)
        # attn_mask: [L, S] or [B*H, L, S]; bool = ignore; float = additive.
        if attn_mask is not None:
            attn_mask = as_numpy(attn_mask, "attn_mask")
            _check_mask_dtype(attn_mask, "attn_mask")
            am = attn_mask
            if am.ndim == 3:
                if am.shape[0] == B * self.num_heads:
                    am = split_axis(am, 0, (B, self.num_heads))
                elif not batched and am.shape[0] == self.num_heads:
                    pass  # unbatched [H, L, S]: broadcast over the batch of 1
                else:
                    raise py_error("SDPA_ERR_SHAPE",
                                   f"attn_mask has shape {attn_mask.shape}, expected ({L}, {S}) or "
                                   f"({B * self.num_heads}, {L}, {S})")
            elif am.ndim != 2:
                raise py_error("SDPA_ERR_RANK",
                               f"attn_mask.ndim={am.ndim}, expected 2 ([L, S]) or 3 ([B*H, L, S])")
            if is_additive(am, "attn_mask"):
                am = _float32_mask(am, "attn_mask")
                bias_arr = am if bias_arr is None else np.add(bias_arr, am, dtype=np.float32)
            else:
                allow_mask = allow_from_ignore(am)
        tmask = attach_view(opt, "attn_mask", mask_view, allow_mask, "attn_mask")
        tkpm = attach_view(opt, "key_padding_mask", mask_view, kpm_allow, "key_padding_mask")
        tbias = attach_view(opt, "attn_bias", tensor_view, bias_arr, "attn_bias")
        kl = attach_vector(opt, "key_lengths", key_lengths, B, "key_lengths")
        ql = attach_vector(opt, "query_lengths", query_lengths, B, "query_lengths")
        opt.causal = 1 if is_causal else 0
        opt.per_head_weights = 0 if average_attn_weights else 1
        # As torch: dropout in [0, 1] (checked again here: the attribute may have been set),
        # ignored in eval mode (the library then gets 0); when training, 1 (every weight
        # dropped) is refused: the library's dropout_p is in [0, 1).
        dropout_p = _check_dropout(self.dropout)
        if not self.training:
            dropout_p = 0.0
        elif dropout_p == 1.0:
            raise py_error("SDPA_ERR_INVALID_ARGUMENT", "dropout=1.0 when training drops every "
                           "attention weight; libsdpa takes dropout in [0, 1) when training (eval() "
                           "ignores it)")
        drops = self.training and dropout_p > 0.0
        opt.training = 1 if self.training else 0
        opt.dropout_p = dropout_p
        opt.dropout_seed = uint64(self.dropout_seed, "dropout_seed")
        opt.dropout_offset = uint64(self.dropout_offset, "dropout_offset")
        opt.empty_rows = choice(empty_rows, EMPTY_ROWS, "empty_rows")
        opt.num_threads = int32(self.num_threads, "num_threads", minimum=0)

        status = lib.sdpa_mha_forward(params, tq, tk, tv, opt, tout, tw)
        lib.check(status)
        del param_views, allow_mask, kpm_allow, bias_arr, kl, ql  # alive until here
        if drops:
            self.dropout_offset = (self.dropout_offset + 1) % 2 ** 64

        if not batched:
            out_user = out_user[0]
            if weights is not None:
                weights = weights[0]
        return out_user, (None if weights is None else wrap(weights, like))

    def _check_shapes(self, query, key, value, batched):
        """The shapes in the layout as passed (the library sees [B, L, E] views of [L, B, E]
        arrays, so its messages would name the view's axes, not the caller's)."""
        if batched:
            b = 0 if self.batch_first else 1
            n = 1 - b
            layout = ("query [B, L, E], key [B, S, kdim], value [B, S, vdim]" if self.batch_first
                      else "query [L, B, E], key [S, B, kdim], value [S, B, vdim]")
            layout += f" (batch_first={self.batch_first})"
        else:
            b, n = None, 0
            layout = "query [L, E], key [S, kdim], value [S, vdim] (unbatched)"
        for name, a, want, what in (("query", query, self.embed_dim, "embed_dim"),
                                    ("key", key, self.kdim, "kdim"), ("value", value, self.vdim, "vdim")):
            if a.shape[-1] != want:
                raise py_error("SDPA_ERR_SHAPE", f"{name}.shape[{a.ndim - 1}]={a.shape[-1]} must be "
                               f"{what}={want}; expected {layout}")
        if b is not None:
            for name, a, other, o in (("key", key, "query", query), ("value", value, "key", key)):
                if a.shape[b] != o.shape[b]:
                    raise py_error("SDPA_ERR_SHAPE", f"{name}.shape[{b}]={a.shape[b]} does not match "
                                   f"{other}.shape[{b}]={o.shape[b]} (the batch B); expected {layout}")
        if value.shape[n] != key.shape[n]:
            raise py_error("SDPA_ERR_SHAPE", f"value.shape[{n}]={value.shape[n]} does not match "
                           f"key.shape[{n}]={key.shape[n]} (the key count S); expected {layout}")

    def _params(self, lib):
        """(SdpaMhaParams, views) for the loaded weights; keep `views` alive during the call."""
        p = _lib.SdpaMhaParams()
        lib.sdpa_mha_params_init_sized(p, ctypes.sizeof(p))
        p.embed_dim = self.embed_dim
        p.num_heads = self.num_heads
        p.num_kv_heads = self.num_kv_heads
        p.head_dim = self.head_dim
        p.kdim = self.kdim
        p.vdim = self.vdim
        p.add_zero_attn = 1 if self.add_zero_attn else 0
        views = []
        for key, array in self._weights.items():
            t = tensor_view(array, key)
            views.append((t, array))
            setattr(p, _PARAM_FIELDS[key], ctypes.addressof(t))
        return p, views
