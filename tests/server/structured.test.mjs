// Structured output beyond response_format basics, as one ctest entry (server_structured):
// the value keywords under strict schemas (json_keywords.test.mjs) and llama.cpp's grammar /
// json_schema fields (gbnf.test.mjs). Each file also runs alone with node --test.
import "./json_keywords.test.mjs";
import "./gbnf.test.mjs";
