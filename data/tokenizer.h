// GPT-2 tokenizer file in llm.c's format: uint32 header[256] (magic 20240328, version 2,
// vocabulary size, end-of-text token), then per token one length byte and its bytes. Only
// decoding is needed here: the data scripts tokenize.
#pragma once
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "io.h"

constexpr uint32_t kTokenizerMagic = 20240328;
constexpr uint32_t kTokenizerVersion = 2;

class Tokenizer {
public:
    explicit Tokenizer(const std::string& path) {
        FILE* f = open_file(path, "rb");
        uint32_t header[256];
        read_exact(header, sizeof(header), f, path, "the tokenizer header");
        if (header[0] != kTokenizerMagic) fatal(1, "%s: bad magic %u in tokenizer (expected %u)", path.c_str(), header[0], kTokenizerMagic);
        if (header[1] != kTokenizerVersion) fatal(1, "%s: unsupported tokenizer version %u (expected %u)", path.c_str(), header[1], kTokenizerVersion);
        eot_ = (int)header[3];
        if (header[3] >= header[2]) fatal(1, "%s: end-of-text token %u is outside the vocabulary of %u", path.c_str(), header[3], header[2]);
        tokens_.resize(header[2]);
        for (auto& t : tokens_) {
            unsigned char len;
            read_exact(&len, 1, f, path, "a token length");
            t.resize(len);
            read_exact(t.data(), len, f, path, "token bytes");
        }
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
