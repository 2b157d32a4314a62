"""Gemma 3's tokenizer and chat template, end to end through trtllm-run, against transformers.

A tiny random Gemma3ForCausalLM with the real tokenizer.json's layout (Replace(" " -> "▁") normalizer,
Split(" ") pre-tokenizer, byte-fallback BPE, <bos> post-processor, Replace/ByteFallback/Fuse decoder;
ids pad 0, eos 1, bos 2, <start_of_turn> 105, <end_of_turn> 106, "\\n" 107), google/gemma-3-*-it's
chat template, and generation_config eos [1, 106]. Its untied lm_head is solved so that greedy decoding
answers ANSWER_CHAT with ANSWER (spaces, newlines, byte-fallback characters) and then <end_of_turn>.
"""
from __future__ import annotations

import json
import random
import types

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.runtime.chat_template import ChatTemplate  # noqa: E402
from trtllm.runtime.cli import main  # noqa: E402
from trtllm.runtime.input_format import parse_input  # noqa: E402
from trtllm.runtime.runner import Runner  # noqa: E402
from trtllm.runtime.text import TextStream  # noqa: E402
from trtllm.runtime.tokenizer import Tokenizer  # noqa: E402

pytestmark = pytest.mark.hf

GEMMA3_TEMPLATE = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", *(f"<unused{i}>" for i in range(99)),
            "<start_of_turn>", "<end_of_turn>"]
NEWLINES = ["\n", "\n\n"]  # plain (not special) added tokens, as "\n" is in the real one
BOS, END_OF_TURN = 2, 106
CORPUS = ["The quick brown fox jumps over the lazy dog.", "What is the capital of France? Paris is the capital.",
          "Edge devices run small language models on CPUs and GPUs.", "Numbers 0 1 2 3 4 5 6 7 8 9 and !?.,;:'\"()",
          "Héllo wörld, ünïcode çafé, naïve. You are a helpful assistant, be brief."] * 20
SYSTEM = {"role": "system", "content": "Be brief."}
ANSWER_CHAT = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
ANSWER = "Paris 🙂 中文\nis  the capital.\n\nBye é"  # 🙂 and 中文 are byte-fallback runs, "  " two spaces
CHATS = [ANSWER_CHAT,
         [SYSTEM, {"role": "user", "content": " 中文  and 🙂 \n"}],  # the same 10-token system prefix (> window 8)
         [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! 🙂 "},
          {"role": "user", "content": "What is the capital of France?"}]]
MAX_NEW = 40


def make_tokenizer(out_dir):
    """A Gemma-3-layout tokenizer.json: BPE trained on CORPUS, ids laid out as in the real one."""
    from tokenizers import AddedToken, Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers

    trained = Backend(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # "▁word" pieces, as SentencePiece
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=420, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = {t: i for i, t in enumerate(SPECIALS + NEWLINES + [f"<0x{b:02X}>" for b in range(256)])}
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    tok = Backend(models.BPE(vocab=vocab, merges=[tuple(m) for m in learned["merges"]], unk_token="<unk>",
                             fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIALS])
    tok.add_tokens([AddedToken(t, normalized=False) for t in NEWLINES])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B:1",
                                                       special_tokens=[("<bos>", BOS)])
    tok.save(str(out_dir / "tokenizer.json"))
    added = {str(vocab[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": t in SPECIALS} for t in SPECIALS + NEWLINES}
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added, "bos_token": "<bos>",
        "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
        "clean_up_tokenization_spaces": False, "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer", "model_max_length": 32768, "padding_side": "left"}))
    (out_dir / "chat_template.jinja").write_text(GEMMA3_TEMPLATE)
    return transformers.AutoTokenizer.from_pretrained(out_dir)


def make_checkpoint(out_dir):
    hf_tok = make_tokenizer(out_dir)
    config = transformers.Gemma3TextConfig(
        vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=BOS,
        eos_token_id=[1, END_OF_TURN], pad_token_id=0, sliding_window=8, query_pre_attn_scalar=24,
        rope_local_base_freq=100.0, layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # large-std weights, as tests/tiny_models.py: well separated greedy logits
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight")
                    else torch.randn_like(p) / p.shape[-1] ** 0.5 * 2.0)
        # Teach it ANSWER: the smallest lm_head change that puts each answer token 10 above the rest
        # of its (teacher-forced) position's logits. The hidden states do not depend on lm_head.
        prompt = hf_tok.apply_chat_template(ANSWER_CHAT, add_generation_prompt=True, tokenize=True)["input_ids"]
        answer = hf_tok.encode(ANSWER, add_special_tokens=False) + [END_OF_TURN]
        hidden = model.model(torch.tensor([prompt + answer[:-1]])).last_hidden_state[0, len(prompt) - 1:]
        logits = hidden @ model.lm_head.weight.T  # [answer, vocab]
        wanted = torch.zeros_like(logits)
        for t, token in enumerate(answer):
            wanted[t, token] = logits[t].max() - logits[t, token] + 10.0
        model.lm_head.weight += wanted.T @ torch.linalg.pinv(hidden).T
    model.generation_config = transformers.GenerationConfig(bos_token_id=BOS, eos_token_id=[1, END_OF_TURN],
                                                            pad_token_id=0, do_sample=False)
    model.save_pretrained(out_dir)
    return hf_tok, model


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    ckpt, engine = tmp_path_factory.mktemp("gemma-chat-ckpt"), tmp_path_factory.mktemp("gemma-chat") / "engine"
    hf_tok, model = make_checkpoint(ckpt)
    build(BuildConfig(model=str(ckpt), output=str(engine), max_batch_size=4, max_input_len=64,
                      max_kv_cache_capacity=128), log=lambda m: None)
    return types.SimpleNamespace(ckpt=ckpt, engine=engine, tok=hf_tok, model=model)


@pytest.fixture(scope="module")
def cli_run(gemma, tmp_path_factory):
    """One greedy `trtllm-run --stream` over CHATS in one batch: (output, streamed pieces per request, profile)."""
    tmp = tmp_path_factory.mktemp("gemma-chat-run")
    payload = {"batch_size": 3, "temperature": 0, "max_generate_length": MAX_NEW, "num_logprobs": 1,
               "requests": [{"messages": chat, "logit_bias": {str(t): b for t, b in bias.items()}}
                            for chat, bias in zip(CHATS, biases(gemma))]}
    (tmp / "input.json").write_text(json.dumps(payload))
    result = CliRunner().invoke(main, [str(tmp / "input.json"), "--engine", str(gemma.engine),
                                       "--output", str(tmp / "out.json"), "--profile", str(tmp / "p.json"), "--stream"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    pieces = [[ln["text"] for ln in lines if ln["request_idx"] == i] for i in range(len(CHATS))]
    return json.loads((tmp / "out.json").read_text()), pieces, json.loads((tmp / "p.json").read_text())


def biases(gemma) -> list[dict[int, float]]:
    """Every chat would get ANSWER (its first token follows from "<start_of_turn>model\\n" alone): the
    others are kept off its first token, and answer what the random weights say."""
    first = gemma.tok.encode(ANSWER, add_special_tokens=False)[0]
    return [{}] + [{first: -100.0}] * (len(CHATS) - 1)


def chat_ids(gemma, chat) -> list[int]:
    return gemma.tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]


def hf_greedy(gemma, prompt: list[int], bias: dict[int, float] | None = None, **generate) -> list[int]:
    """transformers' greedy answer, stopping on generation_config's eos ids [1, 106] unless told otherwise."""
    with torch.no_grad():
        out = gemma.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                                   max_new_tokens=MAX_NEW, do_sample=False,
                                   sequence_bias={(t,): b for t, b in (bias or {}).items()} or None, **generate)
    return out[0, len(prompt):].tolist()


def test_chat_prompt_ids_match_transformers(gemma):
    original, built = (json.loads((d / "tokenizer.json").read_text()) for d in (gemma.ckpt, gemma.engine))
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens"):
        assert built[part] == original[part], part  # the build re-saves the tokenizer: the layout is kept
    tok, limits = Tokenizer.from_engine_dir(gemma.engine), types.SimpleNamespace(max_input_len=64)
    runner = Runner(types.SimpleNamespace(manifest=types.SimpleNamespace(limits=limits, vision={})), tok,
                    ChatTemplate.from_engine_dir(gemma.engine))  # trtllm-run's prompt code, without the engine
    for chat in CHATS:
        for templated in (True, False):
            inp = parse_input({"apply_chat_template": templated, "requests": [{"messages": chat}]})
            p = runner.prepare(0, inp.requests[0], inp, None)
            # without the template: the joined text with the tokenizer's own <bos>, as tokenizer(text)
            want = chat_ids(gemma, chat) if templated else gemma.tok("\n".join(m["content"] for m in chat))["input_ids"]
            assert p.error is None and p.prompt_ids == want, (chat, templated)
            assert want[0] == BOS and want.count(BOS) == 1
            assert p.prompt_ids[:len(p.prefix_ids or ())] == list(p.prefix_ids or ())
    inp = parse_input({"requests": [{"messages": CHATS[0]}]})  # the system prefix that requests share
    assert runner.prepare(0, inp.requests[0], inp, None).system_prefix == "<bos><start_of_turn>user\nBe brief.\n\n"
    # wrong variants that must not pass: the tokenizer's <bos> on top of the template's, or none
    text = gemma.tok.apply_chat_template(CHATS[2], add_generation_prompt=True, tokenize=False)
    assert tok.encode(text, add_special_tokens=True) == [BOS] + chat_ids(gemma, CHATS[2]) != chat_ids(gemma, CHATS[2])
    no_bos = ChatTemplate(GEMMA3_TEMPLATE.replace("{{ bos_token }}", ""), {"bos_token": "<bos>"})
    assert tok.encode(no_bos.render(CHATS[2])) == chat_ids(gemma, CHATS[2])[1:]


def test_content_parts_reach_the_template_as_transformers_passes_them(gemma):
    """Content given as typed parts goes to a template that takes them (Gemma's trims each part and
    reads only the first of a system message) as the list; joined, the prompt would differ."""
    chat = [{"role": "system", "content": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": " Really."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": " world"}]}]
    tok, limits = Tokenizer.from_engine_dir(gemma.engine), types.SimpleNamespace(max_input_len=64)
    runner = Runner(types.SimpleNamespace(manifest=types.SimpleNamespace(limits=limits, vision={})), tok,
                    ChatTemplate.from_engine_dir(gemma.engine))
    inp = parse_input({"requests": [{"messages": chat}]})
    p = runner.prepare(0, inp.requests[0], inp, None)
    assert p.error is None and p.prompt_ids == chat_ids(gemma, chat)
    joined = [{"role": m["role"], "content": "".join(part["text"] for part in m["content"])} for m in chat]
    assert chat_ids(gemma, joined) != chat_ids(gemma, chat)  # the wrong variant: the parts joined first


def test_greedy_cli_matches_transformers(gemma, cli_run):
    out, _, profile = cli_run
    assert profile["prefill"]["reused_tokens"] > 0  # CHATS[1] took CHATS[0]'s system prefix from the batch
    for chat, bias, res in zip(CHATS, biases(gemma), out["responses"]):
        want = hf_greedy(gemma, chat_ids(gemma, chat), bias)
        got = [step[0]["token_id"] for step in res["logprobs"]]  # greedy: the top-1 is the token chosen
        assert got == want, chat
        assert res["output_text"] == gemma.tok.decode(want, skip_special_tokens=True)
        assert res["finish_reason"] == ("end-of-sequence" if want[-1] in (1, END_OF_TURN) else "max-length")
    answer, answer_ids = out["responses"][0], [step[0]["token_id"] for step in out["responses"][0]["logprobs"]]
    assert answer["finish_reason"] == "end-of-sequence" and answer_ids[-1] == END_OF_TURN
    assert answer["output_text"] == ANSWER
    assert b"".join(bytes(step[0]["bytes"]) for step in answer["logprobs"][:-1]) == ANSWER.encode()
    assert out["responses"][1]["finish_reason"] == out["responses"][2]["finish_reason"] == "max-length"
    # wrong variant: stopping on the tokenizer's eos alone (<eos>, not generation_config's <end_of_turn>)
    assert hf_greedy(gemma, chat_ids(gemma, ANSWER_CHAT), eos_token_id=1) != answer_ids


def stream(tok, ids) -> tuple[str, str]:
    """What the runner streams for `ids`, one token at a time: (the pieces joined, the final text)."""
    text = TextStream(tok)
    pieces = [text.take() for i in ids if text.push(i) or True]
    text.finish()
    return "".join(pieces) + text.take(final=True), text.final_text()


def test_streamed_text_matches_transformers_decode(gemma, cli_run):
    out, streamed, _ = cli_run
    for res, pieces in zip(out["responses"], streamed):
        assert "".join(pieces) == res["output_text"]
    assert "".join(streamed[0]) == ANSWER and len(streamed[0]) > 5
    assert any("🙂" in p for p in streamed[0]) and not any("\ufffd" in p for p in streamed[0])  # never split
    # any ids, byte-fallback runs broken or whole, specials and newlines among them: as transformers decodes
    tok, vocab_size, rng = Tokenizer.from_engine_dir(gemma.engine), len(gemma.tok), random.Random(0)
    answer = gemma.tok.encode(ANSWER, add_special_tokens=False)
    byte_ids = sorted(gemma.tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "🙂中é".encode())
    for _ in range(300):
        ids = [rng.choice([rng.randrange(vocab_size), rng.choice(byte_ids), rng.choice(byte_ids), 107, 108, 1,
                           END_OF_TURN, rng.choice(answer)]) for _ in range(rng.randrange(1, 24))]
        ids = ids + answer if rng.random() < 0.3 else ids
        streamed_text, final = stream(tok, ids)
        assert streamed_text == final == gemma.tok.decode(ids, skip_special_tokens=True), ids
    # wrong variant: the same tokenizer without its ByteFallback decoder step streams "<0xF0>..."
    from tokenizers import Tokenizer as Backend, decoders
    backend = Backend.from_file(str(gemma.engine / "tokenizer.json"))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
    wrong = Tokenizer(backend, json.loads((gemma.engine / "tokenizer_config.json").read_text()))
    assert stream(wrong, answer)[1] != ANSWER == stream(tok, answer)[1]
