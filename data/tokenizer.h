// GPT-2 tokenizer file in llm.c's format: uint32 header[256] (magic 20240328, version 2,
// vocabulary size, end-of-text token), then per token one length byte and its bytes. Only
// decoding is needed here: the data scripts tokenize.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/io.h"

constexpr FileFormat kTokenizerFormat{"tokenizer", "the tokenizer header", 20240328, 2};

class Tokenizer {
public:
    explicit Tokenizer(const std::string& path) {
        FILE* f = open_file(path, "rb");
        const FileHeader header = read_header(f, path, kTokenizerFormat);
        const uint32_t vocab = (uint32_t)header[2], eot = (uint32_t)header[3];
        // each token takes at least its length byte: the file's size bounds the count
        const size_t body = file_size(f) - kHeaderBytes;
        if (vocab == 0 || vocab > (uint32_t)INT32_MAX || vocab > body)
            fatal(1, "%s: the header's vocabulary of %u tokens, expected 1 to %zu (a byte each at least, in the file's %zu bytes after the header)",
                  path.c_str(), vocab, std::min<size_t>(body, INT32_MAX), body);
        if (eot >= vocab) fatal(1, "%s: end-of-text token %u is outside the vocabulary of %u", path.c_str(), eot, vocab);
        eot_ = (int)eot;
        tokens_.resize(vocab);
        for (auto& t : tokens_) {
            unsigned char len;
            read_exact(&len, 1, f, path, "a token length");
            t.resize(len);
            read_exact(t.data(), len, f, path, "token bytes");
        }
        if (file_size(f) != (size_t)ftell(f))
            fatal(1, "%s: %zu bytes after the last of the header's %u tokens", path.c_str(), file_size(f) - (size_t)ftell(f), vocab);
        fclose(f);
    }
    int vocab_size() const { return (int)tokens_.size(); }
    int eot() const { return eot_; }
    const std::string& decode(int token) const { return tokens_.at(token); }
    // printable form: whole tokens that are not printable text show as nothing, as llm.c does
    std::string printable(int token) const {
        const std::string& s = decode(token);
        if (s.size() == 1 && !isprint((unsigned char)s[0]) && !isspace((unsigned char)s[0])) return "";
        return s;
    }

private:
    std::vector<std::string> tokens_;
    int eot_ = 0;
};
