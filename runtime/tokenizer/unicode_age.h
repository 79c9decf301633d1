// Which code points Unicode 9.0 had assigned. Hugging Face `tokenizers` normalises with Unicode 9.0
// tables (crate unicode-normalization-alignments), so to reproduce its NFC exactly, characters
// assigned later are treated as inert (combining class 0, no (de)composition) even though
// utf8proc knows them.
//
// Threading: a constant table; safe everywhere.
#pragma once

namespace sx::tokenizer::unicode_age {

// True when `cp` was assigned (any general category except Cn) in Unicode 9.0 or earlier.
bool assigned_in_unicode_9(char32_t cp);

}  // namespace sx::tokenizer::unicode_age
