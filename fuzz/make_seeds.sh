#!/bin/sh
# Seed corpora for the fuzz targets, made from the demo model and tests/data, plus
# ../shared fixtures when that directory exists (every target gets seeds without it).
# usage: fuzz/make_seeds.sh OUTDIR SHARED_DIR [TARGET...]   (default: all targets)
# Writes OUTDIR/<target>/*. Needs jq and perl; exits 77 (skip) without them.
set -eu
out=$1
shared=$2
shift 2
targets=${*:-"safetensors st_index config tokenizer_load encode decode chat_template server_request session json_schema"}
src=$(cd "$(dirname "$0")/.." && pwd)
command -v jq >/dev/null && command -v perl >/dev/null || { echo "make_seeds: needs jq and perl" >&2; exit 77; }
fx=$shared/fixtures

models="$src/models/demo"
for d in "$fx"/models/*; do [ -d "$d" ] && models="$models $d"; done
toks="$fx/tokenizers/llama2 $fx/tokenizers/llama3 $fx/tokenizers/mistral $src/models/demo"

# Small stand-in of a safetensors file: its first tensors with every dim cut to <= 3.
shrink_st() { # FILE OUT
    perl -e 'open F, "<", $ARGV[0] or die; binmode F; read F, $l, 8; $n = unpack "Q<", $l; read F, $h, $n; print $h' "$1" |
        jq -c 'def sz: {"F32":4,"F16":2,"BF16":2,"I8":1,"I16":2,"I32":4,"I64":8,"F64":8,"U8":1}[.] // 1;
          reduce (to_entries | map(select(.key != "__metadata__")) | .[:10])[] as $x ({off: 0, out: {"__metadata__": {"format": "pt"}}};
            ($x.value.shape | map(if . > 3 then 3 else . end)) as $s
            | (($s | reduce .[] as $d (1; . * $d)) * ($x.value.dtype | sz)) as $n
            | .out[$x.key] = {dtype: $x.value.dtype, shape: $s, data_offsets: [.off, .off + $n]} | .off += $n)
          | [.out, .off]' |
        perl -e '$_ = <STDIN>; /^\[(.*),(\d+)\]$/ or die; ($h, $n) = ($1, $2); binmode STDOUT;
                 print pack("Q<", length $h), $h, "\x01" x $n' >"$2"
}

# Tokenizer cut to ids < 600 (plus 4 added tokens) and the merges among them.
shrink_tok() { # DIR
    jq -c '(.model.vocab | with_entries(select(.value < 600))) as $kv
        | .model.vocab = $kv
        | .added_tokens = ((.added_tokens // [])[:4])
        | .model.merges = ([(.model.merges // [])[] | select(
              (if type == "string" then split(" ") else . end) as $p
              | ($p | length) == 2 and $kv[$p[0]] != null and $kv[$p[1]] != null and $kv[$p[0] + $p[1]] != null)] | .[:400])' \
        "$1/tokenizer.json"
}

for t in $targets; do
    d=$out/$t
    rm -rf "$d"
    mkdir -p "$d"
    i=0
    case $t in
    safetensors)
        for m in $models; do
            for f in "$m"/*.safetensors; do
                [ -f "$f" ] || continue
                i=$((i + 1))
                shrink_st "$f" "$d/st$i"
            done
        done
        printf '\010\0\0\0\0\0\0\0{}      ' >"$d/empty" ;;
    st_index)
        [ -f "$fx/models/llama3-tiny-aqlm-1x16g16/model.safetensors.index.json" ] &&
            cp "$fx/models/llama3-tiny-aqlm-1x16g16/model.safetensors.index.json" "$d/llama3-tiny"
        printf '%s' '{"metadata":{"total_size":56},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors","model.norm.weight":"model-00001-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors"}}' >"$d/good" ;;
    config)
        for m in $models; do
            i=$((i + 1))
            cp "$m/config.json" "$d/config$i"
            jq -c 'del(.quantization_config)' "$m/config.json" >"$d/dense$i"
        done ;;
    tokenizer_load)
        for k in $toks; do
            [ -f "$k/tokenizer.json" ] || continue
            i=$((i + 1))
            { shrink_tok "$k"; printf '\0'; cat "$k/tokenizer_config.json" 2>/dev/null || true
              if [ -f "$k/config.json" ]; then printf '\0'; cat "$k/config.json"; fi; } >"$d/tok$i"
        done ;;
    encode)
        sel=0
        for k in $toks; do
            if [ -f "$k/expected.json" ]; then
                jq -j '.[].text + "\u0000"' "$k/expected.json" |
                    perl -e 'binmode STDOUT; $/ = "\0"; $i = 0; while (<STDIN>) { chomp; $i++;
                             open O, ">", "$ARGV[0]/t$ARGV[1]_$i" or die; binmode O; print O chr(2 * $ARGV[1] + 1), $_; close O }' "$d" "$sel"
            fi
            sel=$((sel + 1))
        done
        if [ -f "$fx/text/brown-valid.txt" ]; then
            perl -e 'binmode STDIN; local $/; $t = <STDIN>; for $i (0 .. 15) { open O, ">", "$ARGV[0]/brown$i" or die;
                     binmode O; print O chr(($i % 4) * 2), substr($t, $i * 997, 300 + 40 * $i); close O }' "$d" <"$fx/text/brown-valid.txt"
        fi
        # from the repository alone: the chat-template conversations' texts (Unicode, markup, newlines)
        # and the demo tokenizer's own added tokens, with every selector byte
        jq -j '.. | .content? // empty | strings | . + "\u0000"' "$src/tests/data/chat_templates/conversations.json" |
            perl -e 'binmode STDOUT; $/ = "\0"; $i = 0; while (<STDIN>) { chomp; $i++;
                     open O, ">", "$ARGV[0]/conv_$i" or die; binmode O; print O chr($i % 8), $_; close O }' "$d"
        jq -j '[.added_tokens[]?.content] | join(" x ")' "$src/models/demo/tokenizer.json" |
            perl -e 'binmode STDIN; local $/; $t = <STDIN>; open O, ">", "$ARGV[0]/added" or die; binmode O; print O chr(1), $t, " The jury said"; close O' "$d" ;;
    decode)
        sel=0
        for k in $toks; do
            if [ -f "$k/expected.json" ]; then
                jq -r '.[] | .ids | map(tostring) | join(" ")' "$k/expected.json" |
                    perl -e '$i = 0; while (<STDIN>) { @ids = split; $i++; for $s (0, 1) {
                             open O, ">", "$ARGV[0]/d$ARGV[1]_${i}_$s" or die; binmode O;
                             print O chr(2 * $ARGV[1] + $s), pack("l<*", @ids); close O } }' "$d" "$sel"
            fi
            sel=$((sel + 1))
        done
        perl -e 'binmode STDOUT; print chr(0), pack("l<*", -1, 0, 1, 2, 3, 2147483647, -2147483648, 31999, 32000, 128000, 128255)' >"$d/edge"
        # id runs valid in any vocabulary of >= 512 tokens (the demo's included), with and without specials
        perl -e 'binmode STDOUT; for $s (0 .. 7) { open O, ">", "$ARGV[0]/run$s" or die; binmode O;
                 print O chr($s), pack("l<*", map { ($_ * 37 + $s * 61) % 512 } 0 .. 63 + 32 * $s); close O }' "$d" ;;
    chat_template)
        # byte 0: family * 2 + generation prompt; messages: role byte (mod 4: 0 system, 1 user, 2 assistant) + text, NUL-separated
        for f in 0 1 2 3 4 5 6 7; do
            printf "\\$(printf '%03o' $((f * 2 + 1)))\004You are terse.\000\001Hello there\000\002Hi! How can I help?\000\001Tell me a joke" >"$d/conv$f"
            printf "\\$(printf '%03o' $((f * 2)))\001Only one user turn" >"$d/one$f"
        done
        if [ -f "$fx/tokenizers/llama3/tokenizer_config.json" ]; then
            jq -j '.chat_template' "$fx/tokenizers/llama3/tokenizer_config.json" >"$d/llama3_template"
        fi
        # the published templates kept in the repository (detect + render from their text)
        for c in "$src"/tests/data/chat_templates/*/tokenizer_config.json; do
            i=$((i + 1))
            jq -j '.chat_template | if type == "array" then .[0].template else . end' "$c" >"$d/template$i"
        done ;;
    json_schema)
        # a schema, a NUL, then text fed to the matcher
        printf '%s\000%s' '{"type":"object","properties":{"name":{"type":"string","maxLength":8},"role":{"enum":["a","b",1]},"tags":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3},"n":{"anyOf":[{"type":"integer"},{"type":"null"}]}},"required":["name","role"],"additionalProperties":false}' '{"name":"x\u00e9","role":1,"tags":["a"],"n":null}' >"$d/person"
        printf '%s\000%s' '{"$defs":{"t":{"type":"object","properties":{"v":{"type":"number"},"k":{"type":"array","items":{"$ref":"#/$defs/t"}}}}},"$ref":"#/$defs/t"}' '{"v":-1.5e3,"k":[{"v":0},{"k":[]}]}' >"$d/tree"
        printf '\000%s' '{ "a" : [1, true, null, "s"],
 "b": {}}' >"$d/object"
        printf '%s' '{"type":["string","null"],"pattern":"x"}' >"$d/strict"
        # once a crash: a keyword name with a newline made the compile error two lines
        printf '%s' '{"type\n":["string"],"pattern":"x"}' >"$d/ctrl_name"
        # value keywords: number bounds, multipleOf, pattern, formats, anyOf alternatives alike
        printf '%s\000%s' '{"type":"object","properties":{"a":{"type":"integer","minimum":-50,"exclusiveMaximum":-9,"multipleOf":7},"b":{"type":"number","exclusiveMinimum":0.5,"maximum":2.5,"multipleOf":0.25},"c":{"type":"string","pattern":"^[A-Z]{2}-\\d+$","minLength":3,"maxLength":6},"d":{"type":"string","format":"date-time"},"e":{"type":"string","format":"ipv6"}},"required":["a","b"],"additionalProperties":false}' '{"a":-49,"b":1.75,"c":"AB-12","d":"2024-02-28T10:00:00Z","e":"::1"}' >"$d/keywords"
        printf '%s\000%s' '{"anyOf":[{"type":"object","properties":{"k":{"const":"x"},"r":{"type":"number"}},"required":["k","r"]},{"type":"object","properties":{"k":{"const":"y"},"s":{"type":"integer","maximum":3}}},{"enum":["ab","abc"]},{"type":"null"}]}' '{"s":2,"k":"y"}' >"$d/anyof_alike"
        for f in date time duration email hostname ipv4 uuid; do
            printf '{"type":"string","format":"%s"}\000"\303\251\\n' "$f" >"$d/format_$f"
        done
        printf '%s\000"\\u4e2d\\/\344\270\255"' '{"type":"string","pattern":"^[\\u4e00-\\u9fff]+\\/?$"}' >"$d/pattern_utf8" 
        # GBNF grammars (a "schema" holding ::=), then text
        printf '%s\000%s' 'root ::= (expr "=" ws term "\n"){1,3}
expr ::= term ([-+*/] term)*
term ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num ::= [0-9]+ ws
ws ::= [ \t]*' 'x1 +2*( y -3)= 4
' >"$d/gbnf_arith"
        printf '%s\000%s' 'root ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n"){1,4}
move ::= (pawn | nonpawn | castle) [+#]?
pawn ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
nonpawn ::= [NBRQK] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?' '1. e4 e5
2. Nf3 O-O-O+
' >"$d/gbnf_chess"
        printf '%s\000%s' 'root ::= item{1,5} # list
item ::= "- " [^\r\n\x0b\u2028]{1,40} "\n"' '- milk
- é
' >"$d/gbnf_list"
        printf '%s\000%s' 'root ::= object
value ::= object | array | string | "true" | "null" | [0-9]{1,3}
object ::= "{" ( string ":" value ("," string ":" value)* )? "}"
array ::= "[" ( value ("," value)* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\nu] )* "\""' '{"a":[1,{"b":null}],"c":"\n"}' >"$d/gbnf_json"
        ;;
    server_request)
        # byte 0: route (0 chat, 1 completions, 2 tokenize, 3 detokenize); the rest is the JSON body
        printf '\000%s' '{"model":"demo","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":42,"stop":["\n","END"],"stream":true,"stream_options":{"include_usage":true},"presence_penalty":0.5,"frequency_penalty":-0.5,"n":1}' >"$d/chat"
        printf '\000%s' '{"messages":[{"role":"developer","content":"x"},{"role":"assistant","content":"y"}],"max_completion_tokens":3,"logprobs":false}' >"$d/chat2"
        printf '\001%s' '{"prompt":"The jury said","max_tokens":8,"stop":"said","echo":false,"logprobs":null}' >"$d/cmpl"
        printf '\001%s' '{"prompt":[1,450,432,2857],"seed":-7}' >"$d/cmpl_ids"
        printf '\000%s' '{"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":20,"stream":true}' >"$d/chat_lp"
        printf '\001%s' '{"prompt":"The jury said","max_tokens":0,"echo":true,"logprobs":5}' >"$d/cmpl_echo"
        printf '\001%s' '{"prompt":["one string"],"max_tokens":1e3}' >"$d/cmpl_arr"
        printf '\002%s' '{"content":"Hello world","add_special":true}' >"$d/tok"
        printf '\003%s' '{"tokens":[1,15043,3186]}' >"$d/detok"
        printf '\000%s' '{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"a1b2c3d4e","type":"function","function":{"name":"w","arguments":"{\"c\":1}"}}]},{"role":"tool","tool_call_id":"a1b2c3d4e","content":"22"}],"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"w"}}}' >"$d/chat_tools"
        printf '\000%s' '{"messages":[{"role":"wizard","content":1}],"max_tokens":0}' >"$d/bad" ;;
    session)
        # byte 0: bit 0 fixes the checksum after mutation, bit 1 the f16 context (else q4); the
        # rest is a session file. Real ones come from kvq-chat --prompt-cache ($KVQ_CHAT) on the
        # demo model; without it, a bare header and junk.
        printf '\001KVQS\001\000\000\000' >"$d/header"
        printf '\000not a session' >"$d/junk"
        if [ -n "${KVQ_CHAT:-}" ] && [ -x "$KVQ_CHAT" ]; then
            tmp=$(mktemp -d)
            for ty in q4 f16; do
                "$KVQ_CHAT" -m "$src/models/demo" --backend cpu -t 1 -c 64 -ctk $ty -ctv $ty -n 1 --temp 0 \
                    -p "The jury said that the city" --prompt-cache "$tmp/$ty" >/dev/null 2>&1 || { rm -rf "$tmp"; exit 1; }
            done
            for m in 0 1; do
                { printf "\\00$m"; cat "$tmp/q4"; } >"$d/q4-$m"
                { printf "\\00$((m + 2))"; cat "$tmp/f16"; } >"$d/f16-$m"
                { printf "\\00$((m + 2))"; cat "$tmp/q4"; } >"$d/q4-in-f16-$m"
            done
            rm -rf "$tmp"
        fi ;;
    *) echo "make_seeds: unknown target $t" >&2; exit 2 ;;
    esac
done
