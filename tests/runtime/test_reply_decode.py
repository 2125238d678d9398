"""A reply decoded token by token gives the whole decode's text: after every token a prefix of it (or all of it),
at the end all of it, with tokenizers of both kinds a checkpoint brings (byte-level BPE; SentencePiece-style
Metaspace with byte fallback), random token sequences (characters split over byte tokens), stop tokens left
out, and transformers' clean-up where the tokenizer asks for it — without decoding the whole list again."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from anyfp4.runtime.reply_decode import INCOMPLETE, ReplyDecoder

CORPUS = ["The café's naïve owner said: don't worry , it's fine . Isn't it ?",
          "日本語のテキスト and emoji 😀🎉 mixed with code: def f(x): return x * 2",
          "We've seen they're here ! Numbers 123,456.78 and symbols #@%&* (ok) [yes] {no}"] * 20
SPECIALS = ["<unk>", "<s>", "</s>"]


def byte_level_bpe() -> PreTrainedTokenizerFast:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def metaspace_byte_fallback() -> PreTrainedTokenizerFast:
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS
                                                      + [f"<0x{i:02X}>" for i in range(256)]))
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def unigram_metaspace() -> PreTrainedTokenizerFast:
    """transformers 5 cleans up only non-BPE tokenizers' spaces (``clean_up_tokenization_spaces``): a Unigram one."""
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    t.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=300, special_tokens=SPECIALS, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def sequences(tokenizer, seed: int):
    rng = random.Random(seed)
    text_ids = tokenizer.encode(" ".join(CORPUS[:6]), add_special_tokens=False)
    yield text_ids[:120]
    for _ in range(6):  # random ids: byte tokens that split characters, special tokens, stop tokens
        yield [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(20, 120))]


def whole(tokenizer, tokens, stop_ids):
    return tokenizer.decode([t for t in tokens if t not in stop_ids], skip_special_tokens=True)


@pytest.mark.parametrize("make", [byte_level_bpe, metaspace_byte_fallback, unigram_metaspace])
@pytest.mark.parametrize("cleanup", [False, True])
def test_token_by_token_gives_the_whole_decode(make, cleanup):
    tokenizer = make()
    tokenizer.clean_up_tokenization_spaces = cleanup
    stop_ids = (tokenizer.eos_token_id,)
    checked = 0
    for seed in range(3):
        for tokens in sequences(tokenizer, seed):
            decoder = ReplyDecoder(tokenizer, stop_ids)
            for i in range(1, len(tokens) + 1):
                text = decoder.text(tokens[:i])
                want = whole(tokenizer, tokens[:i], stop_ids)
                # a character still to be completed holds back the tokens' text it came with
                assert text == want if not want.endswith(INCOMPLETE) else want.startswith(text), (i, text, want)
                checked += 1
    assert checked > 500


def test_the_clean_up_is_applied_where_decode_applies_it():
    tokenizer = unigram_metaspace()
    tokenizer.clean_up_tokenization_spaces = True
    decoder = ReplyDecoder(tokenizer, ())
    assert decoder.cleanup == (tokenizer.decode(tokenizer.encode("a . b", add_special_tokens=False)) != "a . b")
    assert decoder.cleanup and decoder.hold_back
    tokens = tokenizer.encode("don't worry , it's fine .", add_special_tokens=False)
    assert decoder.text(tokens) == whole(tokenizer, tokens, ()) == "don't worry, it's fine."


def test_new_tokens_are_decoded_alone(monkeypatch):
    """The whole list is never decoded again: ``text`` calls no ``decode`` of the tokenizer."""
    tokenizer = byte_level_bpe()
    decoder = ReplyDecoder(tokenizer, ())
    calls = []
    monkeypatch.setattr(tokenizer, "decode", lambda *a, **k: calls.append(a))
    tokens = tokenizer.encode(" ".join(CORPUS[:3]), add_special_tokens=False)
    for i in range(1, len(tokens) + 1):
        decoder.text(tokens[:i])
    assert not calls and decoder.text(tokens) == whole(byte_level_bpe(), tokens, ())


def test_a_tokenizer_without_a_backend_is_decoded_whole():
    class Pieces:
        def decode(self, tokens, skip_special_tokens=True):
            return "".join("ab"[t] for t in tokens)

    decoder = ReplyDecoder(Pieces(), (2,))
    assert decoder.text([0, 1, 2, 0]) == "aba" and decoder.hold_back == ()


def test_a_shrinking_token_list_is_refused():
    decoder = ReplyDecoder(byte_level_bpe(), ())
    decoder.text([5, 6, 7])
    with pytest.raises(ValueError, match="only grows"):
        decoder.text([5])
