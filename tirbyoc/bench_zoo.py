"""The model zoo: models from HuggingFace ``transformers`` (built from their configs with
random weights: nothing is downloaded), imported with ``torch.export`` as a user would.

    python -m tirbyoc.bench --models --zoo [--model gpt2] [--batch 1,8]

Each model runs through the same measurement as ``--models`` (``tirbyoc.bench_models``):
numerics against PyTorch, tirbyoc against PyTorch eager and ONNX Runtime interleaved on
the same threads, where the time goes. The table adds what a build costs: seconds to
compile, the exported library's size and its ratio to the model's weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

SEQ = 128
VOCAB = 1000


@dataclass
class ZooModel:
    """``build()``: the eval-mode module taking one tensor ``x``; ``example(batch, seq)``:
    an input; ``text``: token ids (batch x seq, int64) rather than floats of ``shape``
    per example (images; audio for the speech models)."""

    name: str
    build: Callable
    text: bool
    shape: tuple = (3, 224, 224)

    def example(self, batch: int, seq: int = SEQ, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        if self.text:
            return torch.randint(0, VOCAB, (batch, seq), generator=g)
        return torch.randn(batch, *self.shape, generator=g)


def _hidden(model, text, key="pixel_values"):
    """The model's last hidden state (a model with a head: its first output) from one
    argument ``x`` (token ids, else passed as ``key``)."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model.eval()

        def forward(self, x):
            if text:
                return self.model(input_ids=x, use_cache=False).last_hidden_state \
                    if _takes_cache(self.model) else self.model(input_ids=x).last_hidden_state
            out = self.model(**{key: x})
            if isinstance(out, torch.Tensor):  # (a vocoder's waveform)
                return out
            hidden = getattr(out, "last_hidden_state", None)
            return hidden if hidden is not None else out[0]  # (a head's output: DPT's depth)

    return Hidden().eval()


def _takes_cache(model) -> bool:
    import inspect

    return "use_cache" in inspect.signature(model.forward).parameters


def _text(name):
    def build():
        import torch
        import transformers as tf

        torch.manual_seed(0)
        if name == "gpt2":
            cfg = tf.GPT2Config(n_layer=2, vocab_size=VOCAB, n_positions=512, bos_token_id=0,
                                 eos_token_id=0)
        elif name == "llama":  # grouped-query attention, RoPE, RMSNorm, SiLU-gated MLP
            cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=768, intermediate_size=2048,
                                 num_attention_heads=12, num_key_value_heads=4,
                                 vocab_size=VOCAB, max_position_embeddings=512)
        else:
            cfg = tf.BertConfig(num_hidden_layers=2, vocab_size=VOCAB)
        # NOTE: GPT-2 with PyTorch's SDPA attention does not export at batch > 1 (a
        # data-dependent guard in torch.export); its eager attention does
        cfg._attn_implementation = "eager" if name == "gpt2" else "sdpa"
        model = {"gpt2": lambda: tf.GPT2Model(cfg), "llama": lambda: tf.LlamaModel(cfg),
                 "bert": lambda: tf.BertModel(cfg, add_pooling_layer=False)}[name]()
        return _hidden(model, True)
    return build


def _vision(name):
    def build():
        import torch
        import transformers as tf

        torch.manual_seed(0)
        if name == "resnet50":
            model = tf.ResNetModel(tf.ResNetConfig())  # the defaults are ResNet-50's
        elif name == "mobilenet_v2":
            model = tf.MobileNetV2Model(tf.MobileNetV2Config(), add_pooling_layer=False)
        elif name == "efficientnet_b0":
            # NOTE: the config's defaults are B7's (width 2.0, depth 3.1, 600 px)
            model = tf.EfficientNetModel(tf.EfficientNetConfig(
                width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280))
        else:
            model = tf.ConvNextModel(tf.ConvNextConfig())  # ConvNeXt-T
        if name != "resnet50":  # ResNet's initializers (He, unit batch norms) are fine
            _trained_scale(model)
        return _hidden(model, False)
    return build


def _trained_scale(model):
    """Weights of a trained model's scale instead of the configs' initializers, whose
    N(0, 0.02) batch-norm scales make EfficientNet's activations vanish to denormals
    (0.0 at the last stage): convolutions He-initialized, batch norms near identity,
    ConvNeXt's layer scale at 0.1 instead of 1e-6. Seeded: the same model every run."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Conv2d):
                fan_in = mod.weight[0].numel()
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) *
                                 (2.0 / fan_in) ** 0.5)
            elif isinstance(mod, torch.nn.BatchNorm2d):
                for t, lo, hi in ((mod.weight, 0.5, 1.5), (mod.bias, -0.2, 0.2),
                                  (mod.running_mean, -0.2, 0.2), (mod.running_var, 0.5, 1.5)):
                    t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)
            if hasattr(mod, "layer_scale_parameter") and \
                    isinstance(mod.layer_scale_parameter, torch.nn.Parameter):
                mod.layer_scale_parameter.fill_(0.1)


ZOO = {
    **{n: ZooModel(n, _text(n), True) for n in ("gpt2", "llama", "bert")},
    **{n: ZooModel(n, _vision(n), False)
       for n in ("resnet50", "mobilenet_v2", "efficientnet_b0", "convnext")},
}


# Held out: models nothing in tirbyoc was tuned on, from as many families as
# ``transformers`` has (encoders, decoders with grouped-query, multi-query or ALiBi
# attention, parallel residuals, relative position biases, windowed attention, grouped and
# weight-standardized convolutions, group norms, pooling mixers). Two layers for the
# transformers; the vision models at their configs' default sizes, some with fewer
# blocks. ``python -m tirbyoc.bench --models --zoo --held-out --batch 1``.
_TEXT_HELD_OUT = {
    "distilbert": ("DistilBertModel", "DistilBertConfig", dict(n_layers=2)),
    "roberta": ("RobertaModel", "RobertaConfig", dict(num_hidden_layers=2, pad_token_id=1)),
    "albert": ("AlbertModel", "AlbertConfig", dict(
        num_hidden_layers=2, embedding_size=128, hidden_size=768, num_attention_heads=12,
        intermediate_size=3072)),  # (the config's defaults are ALBERT-xxlarge's)
    "electra": ("ElectraModel", "ElectraConfig", dict(num_hidden_layers=2)),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", dict(
        num_hidden_layers=2, hidden_size=384, num_attention_heads=6, intermediate_size=1536)),
    "mpnet": ("MPNetModel", "MPNetConfig", dict(num_hidden_layers=2)),
    "clip_text": ("CLIPTextModel", "CLIPTextConfig", dict(num_hidden_layers=2,
                                                          max_position_embeddings=SEQ)),
    "t5_encoder": ("T5EncoderModel", "T5Config", dict(num_layers=2, d_model=512, d_ff=2048,
                                                      num_heads=8, d_kv=64)),
    **{name: (model, config, dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                                  max_position_embeddings=512, **extra))
       for name, model, config, extra in (
           ("qwen2", "Qwen2Model", "Qwen2Config",
            dict(intermediate_size=1376, num_key_value_heads=2)),
           ("mistral", "MistralModel", "MistralConfig",
            dict(intermediate_size=1376, num_key_value_heads=2)),
           ("gemma", "GemmaModel", "GemmaConfig",
            dict(intermediate_size=1376, num_key_value_heads=1, head_dim=64)),
           ("phi", "PhiModel", "PhiConfig", dict(intermediate_size=2048)),
           ("gpt_neox", "GPTNeoXModel", "GPTNeoXConfig", dict(intermediate_size=2048)),
           ("stablelm", "StableLmModel", "StableLmConfig",
            dict(intermediate_size=1376, num_key_value_heads=8)),
           ("opt", "OPTModel", "OPTConfig", dict(ffn_dim=2048, word_embed_proj_dim=512)),
           # (added after the first 34, as the entries below that say so)
           ("olmo", "OlmoModel", "OlmoConfig", dict(intermediate_size=1376, eos_token_id=0)),
           ("phi3", "Phi3Model", "Phi3Config",
            dict(intermediate_size=1376, pad_token_id=0, eos_token_id=0)),
           ("starcoder2", "Starcoder2Model", "Starcoder2Config",
            dict(intermediate_size=1376, num_key_value_heads=2)))},
    "falcon": ("FalconModel", "FalconConfig", dict(num_hidden_layers=2, hidden_size=512,
                                                   num_attention_heads=8)),
    "bloom": ("BloomModel", "BloomConfig", dict(n_layer=2, hidden_size=512, n_head=8)),
    # added after the first 34: SqueezeBERT's grouped 1-D convs (243 ms a run before
    # they became kernel calls), rotary, local-window, bottleneck and two-stream ones
    "squeezebert": ("SqueezeBertModel", "SqueezeBertConfig", dict(num_hidden_layers=2)),
    "mobilebert": ("MobileBertModel", "MobileBertConfig", dict(num_hidden_layers=2)),
    "gptj": ("GPTJModel", "GPTJConfig", dict(n_layer=2, n_embd=512, n_head=8,
                                            rotary_dim=32, n_positions=512,
                                            bos_token_id=0, eos_token_id=0)),
    "gpt_neo": ("GPTNeoModel", "GPTNeoConfig", dict(
        num_layers=2, hidden_size=512, num_heads=8, window_size=16,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=512,
        bos_token_id=0, eos_token_id=0)),
    "codegen": ("CodeGenModel", "CodeGenConfig", dict(n_layer=2, n_embd=512, n_head=8,
                                                     rotary_dim=32, n_positions=512,
                                                     bos_token_id=0, eos_token_id=0)),
    "xlnet": ("XLNetModel", "XLNetConfig", dict(n_layer=2, d_model=512, n_head=8,
                                               d_inner=2048)),
    # span convolutions through nn.Unfold: TVM's frontend failed on its indexing
    # (``index_tensor: cannot broadcast index shapes``) before torch_frontend
    "convbert": ("ConvBertModel", "ConvBertConfig", dict(num_hidden_layers=2)),
    # pooled query blocks: TVM's frontend made a negative-step arange too long, and the
    # min-pool of its constant mask, run at compile time, crashed the build
    "funnel": ("FunnelBaseModel", "FunnelConfig", dict(block_sizes=[1, 1, 1])),
    # chunked local attention, axial position embeddings, reversible residual layers:
    # a concat that two splits read (TVM's reverse inlining dropped it: no build)
    "reformer": ("ReformerModel", "ReformerConfig", dict(
        attn_layers=["local", "local"], axial_pos_shape=[8, 16], local_attn_chunk_length=16,
        is_decoder=False)),
    # a recurrence over the tokens, unrolled by torch.export: its build did not finish
    # (an inlined expression growing exponentially) before the inlining bound
    "rwkv": ("RwkvModel", "RwkvConfig", dict(num_hidden_layers=2, hidden_size=256,
                                             attention_hidden_size=256,
                                             intermediate_size=1024)),
    # mixtures of experts with transformers' default grouped experts (histc and
    # grouped_mm_fallback, which TVM's frontend does not convert): routed top-k, a
    # shared expert beside the routed ones (Qwen2-MoE), many small experts (OLMoE)
    **{name: (model, config, dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                                  max_position_embeddings=512, **extra))
       for name, model, config, extra in (
           ("mixtral", "MixtralModel", "MixtralConfig",
            dict(intermediate_size=1376, num_key_value_heads=2, num_local_experts=8,
                 num_experts_per_tok=2)),
           ("qwen2_moe", "Qwen2MoeModel", "Qwen2MoeConfig",
            dict(intermediate_size=1376, num_key_value_heads=2, num_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=512,
                 shared_expert_intermediate_size=1024)),
           ("olmoe", "OlmoeModel", "OlmoeConfig",
            dict(intermediate_size=512, num_key_value_heads=8, num_experts=16,
                 num_experts_per_tok=4)),
           # latent attention, grouped routing (topk unsorted), a dense first layer
           ("deepseek_v3", "DeepseekV3Model", "DeepseekV3Config",
            dict(intermediate_size=1024, moe_intermediate_size=256, num_key_value_heads=8,
                 n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                 first_k_dense_replace=1, q_lora_rank=128, kv_lora_rank=64,
                 qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64)),
           # experts with biases and a clamped gate, attention sinks
           ("gpt_oss", "GptOssModel", "GptOssConfig",
            dict(intermediate_size=512, num_key_value_heads=2, head_dim=64,
                 num_local_experts=8, num_experts_per_tok=2, sliding_window=32)))},
    # added after the first 70 (none of them gave a wrong answer): encoder-decoders,
    # rotary encoders, block-sparse and Nystrom attention, multi-query and soft-capped
    # attention, state-space models (Mamba's selective scan unrolled by the export),
    # layout and markup embeddings
    # token mixing by a 2-D Fourier transform (no converter in TVM: torch_fft)
    "fnet": ("FNetModel", "FNetConfig", dict(num_hidden_layers=2)),
    "bart": ("BartModel", "BartConfig", dict(
        encoder_layers=2, decoder_layers=2, d_model=512, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, encoder_attention_heads=8, decoder_attention_heads=8)),
    "big_bird": ("BigBirdModel", "BigBirdConfig", dict(num_hidden_layers=2,
                                                       attention_type="original_full")),
    "nystromformer": ("NystromformerModel", "NystromformerConfig", dict(num_hidden_layers=2)),
    "esm": ("EsmModel", "EsmConfig", dict(
        num_hidden_layers=2, hidden_size=512, num_attention_heads=8, intermediate_size=2048,
        pad_token_id=1, position_embedding_type="rotary")),
    "layoutlm": ("LayoutLMModel", "LayoutLMConfig", dict(num_hidden_layers=2)),
    "roformer": ("RoFormerModel", "RoFormerConfig", dict(num_hidden_layers=2)),
    "rembert": ("RemBertModel", "RemBertConfig", dict(
        num_hidden_layers=2, hidden_size=512, num_attention_heads=8, input_embedding_size=256,
        output_embedding_size=256, intermediate_size=2048)),
    "markuplm": ("MarkupLMModel", "MarkupLMConfig", dict(num_hidden_layers=2)),
    "modernbert": ("ModernBertModel", "ModernBertConfig", dict(
        num_hidden_layers=2, global_attn_every_n_layers=2, local_attention=64, pad_token_id=0,
        bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0)),
    "gpt_bigcode": ("GPTBigCodeModel", "GPTBigCodeConfig", dict(n_layer=2, n_embd=512,
                                                                n_head=8)),
    "gemma2": ("Gemma2Model", "Gemma2Config", dict(
        num_hidden_layers=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, intermediate_size=2048, sliding_window=64)),
    "qwen3": ("Qwen3Model", "Qwen3Config", dict(
        num_hidden_layers=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, intermediate_size=1376)),
    "cohere": ("CohereModel", "CohereConfig", dict(
        num_hidden_layers=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=1376)),
    "mamba": ("MambaModel", "MambaConfig", dict(num_hidden_layers=2, hidden_size=256,
                                                state_size=16)),
    "mamba2": ("Mamba2Model", "Mamba2Config", dict(num_hidden_layers=2, hidden_size=256,
                                                   num_heads=8, head_dim=64, n_groups=1)),
    "recurrent_gemma": ("RecurrentGemmaModel", "RecurrentGemmaConfig", dict(
        num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=768,
        lru_width=256, attention_window_size=64)),
}
_VISION_HELD_OUT = {
    "vit": ("ViTModel", "ViTConfig", dict(num_hidden_layers=2)),
    "deit": ("DeiTModel", "DeiTConfig", dict(num_hidden_layers=2)),
    "beit": ("BeitModel", "BeitConfig", dict(num_hidden_layers=2,
                                             use_relative_position_bias=True)),
    "dinov2": ("Dinov2Model", "Dinov2Config", dict(num_hidden_layers=2)),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", dict(num_hidden_layers=2)),
    "yolos": ("YolosModel", "YolosConfig", dict(num_hidden_layers=2)),
    "dpt": ("DPTModel", "DPTConfig", dict(num_hidden_layers=2)),
    "swin": ("SwinModel", "SwinConfig", dict(depths=[1, 1, 2, 1])),
    "levit": ("LevitModel", "LevitConfig", {}),
    "mobilevit": ("MobileViTModel", "MobileViTConfig", {}),
    "segformer": ("SegformerModel", "SegformerConfig", {}),
    "poolformer": ("PoolFormerModel", "PoolFormerConfig", {}),
    "convnextv2": ("ConvNextV2Model", "ConvNextV2Config", dict(depths=[1, 1, 3, 1])),
    "resnet18": ("ResNetModel", "ResNetConfig", dict(
        layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512])),
    "regnet": ("RegNetModel", "RegNetConfig", {}),
    "bit": ("BitModel", "BitConfig", {}),
    "mobilenet_v1": ("MobileNetV1Model", "MobileNetV1Config", {}),
    # added after the first 34: Hiera's mask-unit max-pools (a sort each, 29 ms of 61,
    # before fixups.fix_topk_one), focal modulation, spatial-reduction attention,
    # convolutional token embeddings, depth estimation
    "hiera": ("HieraModel", "HieraConfig", dict(depths=[1, 1, 2, 1])),
    "focalnet": ("FocalNetModel", "FocalNetConfig", dict(depths=[1, 1, 2, 1])),
    "pvt": ("PvtModel", "PvtConfig", {}),
    "cvt": ("CvtModel", "CvtConfig", {}),
    "swiftformer": ("SwiftFormerModel", "SwiftFormerConfig", {}),
    "glpn": ("GLPNModel", "GLPNConfig", {}),
    "data2vec_vision": ("Data2VecVisionModel", "Data2VecVisionConfig",
                        dict(num_hidden_layers=2)),
    # with its neck and head: upsampling by transposed convs whose kernel is their stride
    # (2.0 s of a 2.4 s run as TVM's schedule, before they became a dense each)
    # a clip of 8 frames in 2 x 16 x 16 tubelets: a conv3d whose kernel is its stride
    # (TVM's conv3d took 582 of 855 ms before it became a dense)
    "videomae": ("VideoMAEModel", "VideoMAEConfig", dict(num_hidden_layers=2, num_frames=8),
                 "pixel_values", (8, 3, 224, 224)),
    # added after the first 70: windowed attention with a continuous position bias,
    # register tokens (none in DINOv3's config: a constant of no elements, which TVM could
    # not load back), SAM's image encoder, divided space-time attention
    "swinv2": ("Swinv2Model", "Swinv2Config", dict(depths=[1, 1, 2, 1]), "pixel_values",
               (3, 256, 256)),
    "dinov3_vit": ("DINOv3ViTModel", "DINOv3ViTConfig", dict(num_hidden_layers=2)),
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", dict(num_hidden_layers=2)),
    "sam_vision": ("SamVisionModel", "SamVisionConfig", dict(
        num_hidden_layers=2, image_size=256, global_attn_indexes=[1]), "pixel_values",
        (3, 256, 256)),
    "timesformer": ("TimesformerModel", "TimesformerConfig", dict(num_hidden_layers=2,
                                                                  num_frames=4),
                    "pixel_values", (4, 3, 224, 224)),
    "mobilevitv2": ("MobileViTV2Model", "MobileViTV2Config", {}),
    "pvt_v2": ("PvtV2Model", "PvtV2Config", {}),
    "textnet": ("TextNetModel", "TextNetConfig", {}),
    "dpt_depth": ("DPTForDepthEstimation", "DPTConfig",
                  dict(num_hidden_layers=4, backbone_out_indices=[0, 1, 2, 3]),
                  "pixel_values", (3, 384, 384)),
}


# Speech: (model, config, config kwargs, the input's keyword, one example's shape).
# wav2vec 2.0 and HuBERT read one second of 16 kHz audio through 1-D convs (1.8 s a run
# before they became kernel calls); WavLM as wav2vec 2.0 with a gated relative position
# bias (two sigmoids of one tensor's halves in one fused function: a vectorizer failure
# before fastmath stopped using Lets); Whisper's encoder 1000 frames of 80 mel bins.
_AUDIO_HELD_OUT = {
    # added after the first 70: a spectrogram transformer, a conformer with rotary
    # positions, Data2Vec's feature extractor (a layer norm between transposes)
    "ast": ("ASTModel", "ASTConfig", dict(num_hidden_layers=2), "input_values", (1024, 128)),
    "wav2vec2_conformer": ("Wav2Vec2ConformerModel", "Wav2Vec2ConformerConfig", dict(
        num_hidden_layers=2, position_embeddings_type="rotary"), "input_values", (16000,)),
    "data2vec_audio": ("Data2VecAudioModel", "Data2VecAudioConfig", dict(num_hidden_layers=2),
                       "input_values", (16000,)),
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", dict(num_hidden_layers=2),
                 "input_values", (16000,)),
    "hubert": ("HubertModel", "HubertConfig", dict(num_hidden_layers=2), "input_values",
               (16000,)),
    "wavlm": ("WavLMModel", "WavLMConfig", dict(num_hidden_layers=2), "input_values",
              (16000,)),
    # disentangled attention over log-spaced position buckets (a log of integers)
    "sew_d": ("SEWDModel", "SEWDConfig", dict(num_hidden_layers=2), "input_values",
              (16000,)),
    "whisper_encoder": ("whisper.WhisperEncoder", "WhisperConfig", dict(
        encoder_layers=2, d_model=384, encoder_attention_heads=6, encoder_ffn_dim=1536,
        max_source_positions=500, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1), "input_features", (80, 1000)),
    # a time series (512 steps of 7 channels) cut into patches by Tensor.unfold (no
    # converter in TVM)
    "patchtst": ("PatchTSTModel", "PatchTSTConfig", dict(
        num_input_channels=7, context_length=512, num_hidden_layers=2), "past_values",
        (512, 7)),
    # vocoders and codec decoders: upsampling by transposed 1-D convs of kernel twice the
    # stride (TVM's schedule of them took 58 of HiFi-GAN's 74 ms), dilated residual convs;
    # Mimi's causal convs pad by what they compute from buffers with .item() (it did not
    # import) and run an ELU before each pad
    "hifigan": ("SpeechT5HifiGan", "SpeechT5HifiGanConfig", {}, "spectrogram", (50, 80)),
    "mimi_decoder": ("mimi.MimiDecoder", "MimiConfig", {}, "hidden_states", (512, 20)),
    "dac_decoder": ("dac.DacDecoder", "DacConfig", {}, "hidden_state", (1024, 20)),
}


def _held_out(name, text, model_name, config_name, kwargs, key="pixel_values",
              shape=(3, 224, 224)):
    def build():
        import inspect

        import torch
        import transformers as tf

        torch.manual_seed(0)
        extra = dict(vocab_size=VOCAB) if text else {}
        cfg = getattr(tf, config_name)(**kwargs, **extra)
        if "." in model_name:  # a part of a model: family.Class, from its modeling file
            import importlib

            family, part = model_name.split(".")
            cls = getattr(importlib.import_module(
                f"transformers.models.{family}.modeling_{family}"), part)
        else:
            cls = getattr(tf, model_name)
        pooling = "add_pooling_layer" in inspect.signature(cls.__init__).parameters
        model = cls(cfg, add_pooling_layer=False) if pooling else cls(cfg)
        if not text:
            _trained_scale(model)
        return _hidden(model, text, key)
    return ZooModel(name, build, text, shape)


HELD_OUT = {
    **{n: _held_out(n, True, *spec) for n, spec in _TEXT_HELD_OUT.items()},
    **{n: _held_out(n, False, *spec) for n, spec in _VISION_HELD_OUT.items()},
    **{n: _held_out(n, False, *spec) for n, spec in _AUDIO_HELD_OUT.items()},
}


def _weight_bytes(mod) -> int:
    """Bytes of the module's constants (its weights: imported with weights as constants)."""
    from . import _tvm as T

    seen, total = set(), 0

    def visit(e):
        nonlocal total
        if isinstance(e, T.RelaxConstant) and e not in seen:
            seen.add(e)
            total += int(T.constant_value(e).nbytes)

    for gv, func in mod.functions.items():
        if isinstance(func, T.relax_ns.Function):
            T.relax_ns.analysis.post_order_visit(func, visit)
    return total


def _library_bytes(ex) -> int:
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.so")
        ex.export_library(path)
        return os.path.getsize(path)


def _experts_owner(model):
    """The outermost ``transformers`` model in ``model`` (it sets how its experts run),
    or None."""
    return next((m for m in model.modules() if hasattr(m, "set_experts_implementation")),
                None)


def _grouped_experts(model) -> bool:
    """Whether ``model``'s experts run as grouped products (``transformers``' default)."""
    config = getattr(_experts_owner(model), "config", None)
    return getattr(config, "_experts_implementation", None) == "grouped_mm"


def _with_experts(model, implementation: str):
    """A copy of ``model`` whose experts run as ``implementation`` ("eager": one loop
    over the experts, the same products)."""
    import copy

    clone = copy.deepcopy(model)
    _experts_owner(clone).set_experts_implementation(implementation)
    return clone


# Sequence lengths a build for every length is also checked at (besides SEQ).
OTHER_LENGTHS = (7, 300)


def bench_zoo_model(zoo: ZooModel, batch: int, threads: int, reps: int, settle: float,
                    progress=print, dynamic: bool = False) -> dict:
    """One row: ``zoo`` at ``batch`` (sequence ``SEQ`` for text). ``dynamic``: a text
    model built once for every sequence length (``torch.export.Dim``, 2 to 512), timed
    at ``SEQ`` and its numerics also checked at ``OTHER_LENGTHS``."""
    import time

    import torch
    import tvm

    import tirbyoc
    from . import bench_models as bm
    from . import examples

    model = zoo.build()
    example = zoo.example(batch)
    dynamic = dynamic and zoo.text
    mod = examples.import_torch(model, example, dynamic_seq=dynamic)
    report = tirbyoc.explain(mod)
    start = time.perf_counter()
    ours = tirbyoc.compile(mod)
    build_s = time.perf_counter() - start
    lib_bytes, weights = _library_bytes(ours), _weight_bytes(mod)
    # NOTE: grouped experts do not export to ONNX (a custom op), and the batched form the
    # exporter takes gathers every routed row's expert weights (Mixtral at batch 1:
    # ONNX Runtime 420 ms against PyTorch's 40; at batch 8 it ran out of memory): no
    # ONNX Runtime for them. PyTorch's grouped product takes no float64: the reference
    # runs the same experts one at a time.
    grouped = _grouped_experts(model)
    sess = None if grouped else bm._ort_session(bm.onnx_bytes(model, example), threads)
    x = zoo.example(batch, seed=1)
    xn = x.numpy()
    # NOTE: the reference is the model in float64: PyTorch's float32 output is a
    # contender like the others (MobileNetV2's random batch norms put its error and
    # ONNX Runtime's at 1.5e-4 of a float32 reference)
    import copy

    double = (_with_experts(model, "eager") if grouped else copy.deepcopy(model)).double()
    with torch.no_grad():
        ref = double(x if zoo.text else x.double()).numpy()
        mine = model(x).numpy()
    vm = bm._vm(ours)
    xt = tvm.runtime.tensor(xn)
    c = bm.Contenders()
    c.fns["tirbyoc"] = lambda: vm["main"](xt)
    c.fns["torch"] = lambda: bm._torch_call(model, x)
    c.outputs = {"tirbyoc": bm._first(vm["main"](xt)), "torch": mine}
    if sess is not None:
        c.fns["ort"] = lambda: sess.run(None, {"x": xn})
        c.outputs["ort"] = sess.run(None, {"x": xn})[0]
    other = {}
    for seq in OTHER_LENGTHS if dynamic else ():
        xs = zoo.example(batch, seq, seed=2)
        with torch.no_grad():
            want = double(xs).numpy()
        other[seq] = bm._rel_err(bm._first(vm["main"](tvm.runtime.tensor(xs.numpy()))), want)
    label = f"{zoo.name} (any length)" if dynamic else zoo.name
    row = bm._measure(label, c, ref, reps, 1, settle, vm, [xt],
                      {"shape": list(xn.shape), "build": "dynamic-seq" if dynamic else "static",
                       "other_lengths_rel_err": other,
                       "offloaded": [r.intrinsic for r in report.offloaded],
                       "build_s": build_s, "library_mb": lib_bytes / 2**20,
                       "weights_mb": weights / 2**20,
                       "grouped_experts": grouped})
    progress(f"  measured {zoo.name} {list(xn.shape)}: build {build_s:.1f} s")
    return row


def report(rows, threads) -> str:
    from . import bench_models as bm

    lines = bm.report(rows, threads).split("\n")
    extra = [f"{'model':28s} {'shape':16s} {'build s':>8s} {'library MB':>11s} "
             f"{'weights MB':>11s} {'lib/weights':>12s}"]
    for r in rows:
        shape = "x".join(str(d) for d in r["shape"])
        extra.append(f"{r['model']:28s} {shape:16s} {r['build_s']:8.1f} "
                     f"{r['library_mb']:11.1f} {r['weights_mb']:11.1f} "
                     f"{r['library_mb'] / max(r['weights_mb'], 1e-9):11.2f}x")
    for r in rows:
        if r.get("other_lengths_rel_err"):
            extra.append(f"{r['model']}: one build, also at lengths " + ", ".join(
                f"{seq} (error {err:.1e})" for seq, err in r["other_lengths_rel_err"].items()))
    for r in {r["model"]: r for r in rows}.values():  # (once a model)
        if r.get("grouped_experts"):
            extra.append(f"{r['model']}: no ONNX Runtime: its grouped experts do not export "
                         f"(the batched form that does gathers every routed row's expert "
                         f"weights); the float64 reference runs them one at a time")
    cut = next(i for i, line in enumerate(lines) if line.startswith("where the time goes"))
    return "\n".join(lines[:cut] + extra + [""] + lines[cut:])


def run_zoo(names, batches=(1, 8), threads=2, reps=20, settle=None, out="bench-results",
            dynamic=False, zoo=None) -> int:
    """``zoo``: the models by name (default ZOO; HELD_OUT the held-out ones)."""
    import sys

    from . import bench_models as bm
    from .timing import SETTLE_SECONDS

    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise SystemExit("the zoo needs transformers: pip install 'tirbyoc[bench]'") from exc
    bm._set_threads(threads)
    zoo = ZOO if zoo is None else zoo
    unknown = [n for n in names if n not in zoo]
    if unknown:
        raise SystemExit(f"unknown zoo model(s) {unknown}; known: {', '.join(zoo)}")
    rows, failed = [], []
    for name in names:
        for batch in (batches if zoo[name].text else (1,)):
            try:
                rows.append(bench_zoo_model(zoo[name], batch, threads, reps,
                                            SETTLE_SECONDS if settle is None else settle,
                                            progress=lambda s: print(s, file=sys.stderr),
                                            dynamic=dynamic))
            except Exception as exc:  # noqa: BLE001 (reported in the table's footer)
                failed.append(f"{name} batch {batch}: {bm.failure(exc)}")
                print(f"  {name} batch {batch} FAILED: {failed[-1]}", file=sys.stderr)
    # NOTE: peers' errors past RTOL are named under the table; tirbyoc's decide, against
    # the float64 model (MobileNetV2's random batch norms put PyTorch's, ONNX Runtime's and
    # tirbyoc's float32 at 1.1-1.3e-4 of it: the bar follows ONNX Runtime's error)
    bad = [f"{r['model']} {r['shape']}: {r['rel_err']['tirbyoc']:.1e}" for r in rows
           if r["rel_err"]["tirbyoc"] > bm.float64_tolerance(r["rel_err"])]
    bad += [f"{r['model']} at length {seq}: {err:.1e}" for r in rows
            for seq, err in r.get("other_lengths_rel_err", {}).items() if err > bm.RTOL]
    return bm.finish(rows, report(rows, threads) if rows else "", failed, bad, out, threads,
                     "zoo")
