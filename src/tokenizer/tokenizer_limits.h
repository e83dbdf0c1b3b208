/* What a tokenizer takes at most: the interface states it (tokenizer.h), the
 * implementations enforce it. */
#ifndef SHLM_TOKENIZER_LIMITS_H
#define SHLM_TOKENIZER_LIMITS_H

/* The longest piece of text a tokenizer encodes at once, in bytes: a pre-token of a Hugging
 * Face tokenizer, a word (a run up to a space) of a SentencePiece BPE, the whole text for
 * the other SentencePiece models. Encoding holds memory in proportion to the piece (a
 * 16 MiB word of random letters: ~25 bytes per byte with SmolLM2's tokenizer.json, ~30
 * with Mistral's tokenizer.model in C; more through libsentencepiece): a longer piece is
 * refused, not run out of memory on. Text in a language written with spaces stays far
 * below it; 4 MiB is also a long document of a script without spaces as one SentencePiece
 * word. */
enum { TOKENIZER_MAX_PIECE = 4 << 20 };

#endif
