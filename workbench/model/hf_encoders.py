"""The architectures of workbench.model.hf with an encoder: BERT (encoder only), BART and T5
(encoder-decoder); the weight mappings that are not the identity: workbench.model.hf's docstring."""

from __future__ import annotations

import torch

from workbench.errors import SpecError
from workbench.model.hf_architecture import GELU_ACT, GELU_APPROXIMATE, Architecture, ffn_width
from workbench.model.state_links import Link, attention, cross_kv, linear, mlp, norm, rows, same

# An encoder-decoder's decoder starts from <bos> (workbench.tasks.base), as generate does
DECODER_START = dict(decoder_start_token_id=1)


class Bert(Architecture):
    model_type, hf_class, auto_class = "bert", "BertModel", "AutoModel"
    unmapped = ("pooler.",)  # BertModel's [CLS] pooler: not part of the hidden states (an export has none)
    build_kwargs = {"add_pooling_layer": False}

    def requirements(self, spec):
        return {"family": "encoder", "position.name": "learned", "attention.name": "full", "attention.scaled": True,
                "norm.name": "post", "norm.type": "layernorm", "ffn.name": "gelu", "embedding_norm": "layernorm",
                "n_kv_heads": spec.n_heads, "bias": True, "tie_embeddings": True}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.n_layers,
                    num_attention_heads=spec.n_heads, intermediate_size=ffn_width(spec),
                    hidden_act=GELU_ACT[spec.ffn.params.approximate], max_position_embeddings=spec.position.params.max_len,
                    type_vocab_size=1, layer_norm_eps=spec.norm.params.eps, hidden_dropout_prob=spec.dropout,
                    attention_probs_dropout_prob=0.0)

    def spec(self, c):
        return dict(family="encoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                    n_heads=c.num_attention_heads, position={"name": "learned", "max_len": c.max_position_embeddings},
                    attention="full", norm={"name": "post", "type": "layernorm", "eps": c.layer_norm_eps},
                    ffn={"name": "gelu", "d_ff": c.intermediate_size, "approximate": GELU_APPROXIMATE[c.hidden_act]},
                    embedding_norm="layernorm", bias=True, tie_embeddings=True)

    def links(self, spec):
        positions = Link("encoder.position.table.weight", ("embeddings.position_embeddings.weight",
                                                           "embeddings.token_type_embeddings.weight"),
                         lambda t: [t, torch.zeros_like(t[:1])], lambda ts: ts[0] + ts[1][0])
        out = [same("embedding.weight", "embeddings.word_embeddings.weight"), positions]
        out += norm("encoder.embedding_norm", "embeddings.LayerNorm", spec)
        for i in range(spec.n_layers):
            ours, theirs = f"encoder.blocks.{i}", f"encoder.layer.{i}"
            att = f"{theirs}.attention"
            out += attention(f"{ours}.attn", (f"{att}.self.query", f"{att}.self.key", f"{att}.self.value",
                                              f"{att}.output.dense"), spec, True)
            out += norm(f"{ours}.attn_norm.norm", f"{att}.output.LayerNorm", spec)
            out += mlp(f"{ours}.ffn", f"{theirs}.intermediate.dense", f"{theirs}.output.dense", True)
            out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.output.LayerNorm", spec)
        return out


class Bart(Architecture):
    model_type, hf_class, auto_class = "bart", "BartForConditionalGeneration", "AutoModelForSeq2SeqLM"

    def requirements(self, spec):
        return {"family": "encoder_decoder", "position.name": "learned", "attention.name": "full",
                "attention.scaled": True, "norm.name": "post", "norm.type": "layernorm", "norm.eps": 1e-5,
                "ffn.name": "gelu", "embedding_norm": "layernorm", "n_kv_heads": spec.n_heads, "bias": True,
                "tie_embeddings": True}

    def config(self, spec):
        d_ff = ffn_width(spec)
        return dict(vocab_size=spec.vocab_size, d_model=spec.d_model, encoder_layers=spec.encoder_layers,
                    decoder_layers=spec.decoder_layers, encoder_attention_heads=spec.n_heads,
                    decoder_attention_heads=spec.n_heads, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff,
                    activation_function=GELU_ACT[spec.ffn.params.approximate],
                    max_position_embeddings=spec.position.params.max_len, dropout=spec.dropout, attention_dropout=0.0,
                    activation_dropout=0.0, scale_embedding=False, tie_word_embeddings=True, **DECODER_START,
                    forced_bos_token_id=None, forced_eos_token_id=None)

    def spec(self, c):
        if c.scale_embedding or c.encoder_attention_heads != c.decoder_attention_heads or \
                c.encoder_ffn_dim != c.decoder_ffn_dim:
            raise SpecError("scale_embedding", "the workbench needs scale_embedding false and equal encoder and "
                            "decoder heads and FFN widths")
        return dict(family="encoder_decoder", vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.encoder_layers,
                    n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers,
                    n_heads=c.encoder_attention_heads, position={"name": "learned", "max_len": c.max_position_embeddings},
                    attention="full", norm={"name": "post", "type": "layernorm", "eps": 1e-5},
                    ffn={"name": "gelu", "d_ff": c.encoder_ffn_dim,
                         "approximate": GELU_APPROXIMATE[c.activation_function]},
                    embedding_norm="layernorm", bias=True, tie_embeddings=True)

    def links(self, spec):
        out = [same("embedding.weight", "model.shared.weight")]
        for stack, n_layers in (("encoder", spec.encoder_layers), ("decoder", spec.decoder_layers)):
            # BART's position p reads row p + 2; rows 0 and 1 are never read (an export writes zeros)
            out.append(Link(f"{stack}.position.table.weight", (f"model.{stack}.embed_positions.weight",),
                            lambda t: [torch.cat([torch.zeros_like(t[:2]), t])], lambda ts: ts[0][2:]))
            out += norm(f"{stack}.embedding_norm", f"model.{stack}.layernorm_embedding", spec)
            for i in range(n_layers):
                ours, theirs = f"{stack}.blocks.{i}", f"model.{stack}.layers.{i}"
                att = f"{theirs}.self_attn"
                out += attention(f"{ours}.attn", (f"{att}.q_proj", f"{att}.k_proj", f"{att}.v_proj", f"{att}.out_proj"),
                                 spec, True)
                out += norm(f"{ours}.attn_norm.norm", f"{theirs}.self_attn_layer_norm", spec)
                if stack == "decoder":
                    cross = f"{theirs}.encoder_attn"
                    out += linear(f"{ours}.cross.q", f"{cross}.q_proj", True)
                    out += cross_kv(f"{ours}.cross.kv", f"{cross}.k_proj", f"{cross}.v_proj", spec, True)
                    out += linear(f"{ours}.cross.out", f"{cross}.out_proj", True)
                    out += norm(f"{ours}.cross_norm.norm", f"{theirs}.encoder_attn_layer_norm", spec)
                out += mlp(f"{ours}.ffn", f"{theirs}.fc1", f"{theirs}.fc2", True)
                out += norm(f"{ours}.ffn_norm.norm", f"{theirs}.final_layer_norm", spec)
        return out


T5_FFN = {"relu": "relu", "geglu": "gated-gelu"}


class T5(Architecture):
    model_type, hf_class, auto_class = "t5", "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM"
    any_head_dim = True

    def requirements(self, spec):
        ffn = {"ffn.name": spec.ffn.name if spec.ffn.name in T5_FFN else "relu"}
        if spec.ffn.name == "geglu":
            ffn["ffn.approximate"] = "tanh"  # T5 v1.1's gated-gelu is gelu_new
        # transformers 5 always ties T5's head to the embeddings (as ours is tied)
        return {"family": "encoder_decoder", "position.name": "t5_bias", "attention.name": "full",
                "attention.scaled": False, "norm.name": "pre", "norm.type": "rmsnorm", **ffn,
                "embedding_norm": "none", "bias": False, "tie_embeddings": True}

    def config(self, spec):
        return dict(vocab_size=spec.vocab_size, d_model=spec.d_model, d_kv=spec.head_dim, d_ff=ffn_width(spec),
                    num_layers=spec.encoder_layers, num_decoder_layers=spec.decoder_layers, num_heads=spec.n_heads,
                    relative_attention_num_buckets=spec.position.params.num_buckets,
                    relative_attention_max_distance=spec.position.params.max_distance,
                    layer_norm_epsilon=spec.norm.params.eps, feed_forward_proj=T5_FFN[spec.ffn.name],
                    # in transformers 5, tie_word_embeddings=False means: no d_model^-0.5 rescaling of the
                    # decoder output before the (tied) head, which ours does not have
                    dropout_rate=spec.dropout, tie_word_embeddings=False, **DECODER_START)

    def spec(self, c):
        ffn = {"relu": {"name": "relu"}, "gated-gelu": {"name": "geglu", "approximate": "tanh"}}
        if c.feed_forward_proj not in ffn:
            raise SpecError("feed_forward_proj", f"the workbench maps relu or gated-gelu, got {c.feed_forward_proj!r}")
        if getattr(c, "scale_decoder_outputs", True):  # the original T5's rescaling before the head (T5 v1.1: none)
            raise SpecError("scale_decoder_outputs", "the workbench's head reads the decoder output unscaled: "
                            "needs false (a config made with tie_word_embeddings=False)")
        return dict(family="encoder_decoder", vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.num_layers,
                    n_encoder_layers=c.num_layers, n_decoder_layers=c.num_decoder_layers, n_heads=c.num_heads,
                    head_dim=c.d_kv, position={"name": "t5_bias", "num_buckets": c.relative_attention_num_buckets,
                                               "max_distance": c.relative_attention_max_distance},
                    attention={"name": "full", "scaled": False},
                    norm={"name": "pre", "type": "rmsnorm", "eps": c.layer_norm_epsilon},
                    ffn={**ffn[c.feed_forward_proj], "d_ff": c.d_ff}, bias=False, tie_embeddings=True)

    def links(self, spec):
        out = [same("embedding.weight", "shared.weight")]
        for stack, n_layers in (("encoder", spec.encoder_layers), ("decoder", spec.decoder_layers)):
            out.append(same(f"{stack}.position.table.weight",
                            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
            for i in range(n_layers):
                ours, theirs = f"{stack}.blocks.{i}", f"{stack}.block.{i}.layer"
                att = f"{theirs}.0.SelfAttention"
                out += norm(f"{ours}.attn_norm.norm", f"{theirs}.0.layer_norm", spec)
                out += attention(f"{ours}.attn", (f"{att}.q", f"{att}.k", f"{att}.v", f"{att}.o"), spec, False)
                ffn = f"{theirs}.1"
                if stack == "decoder":
                    cross, ffn = f"{theirs}.1.EncDecAttention", f"{theirs}.2"
                    out += norm(f"{ours}.cross_norm.norm", f"{theirs}.1.layer_norm", spec)
                    out += linear(f"{ours}.cross.q", f"{cross}.q", False)
                    out += cross_kv(f"{ours}.cross.kv", f"{cross}.k", f"{cross}.v", spec, False)
                    out += linear(f"{ours}.cross.out", f"{cross}.o", False)
                out += norm(f"{ours}.ffn_norm.norm", f"{ffn}.layer_norm", spec)
                if spec.ffn.name == "geglu":
                    d_ff = ffn_width(spec)
                    out.append(rows(f"{ours}.ffn.gate_up.weight", [(f"{ffn}.DenseReluDense.wi_0.weight", d_ff, None),
                                                                  (f"{ffn}.DenseReluDense.wi_1.weight", d_ff, None)]))
                else:
                    out += linear(f"{ours}.ffn.up", f"{ffn}.DenseReluDense.wi", False)
                out += linear(f"{ours}.ffn.down", f"{ffn}.DenseReluDense.wo", False)
            out += norm(f"{stack}.final_norm", f"{stack}.final_layer_norm", spec)
        return out
