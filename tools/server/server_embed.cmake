# Writes OUT, a C file holding the bytes of IN as kvq_server_ui[] (kvq-server's page).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\\n" body "${body}")
file(WRITE "${OUT}" "/* generated from tools/server/server_ui.html by tools/server/server_embed.cmake */\n#include <stddef.h>\nconst unsigned char kvq_server_ui[] = {\n${body}0};\nconst size_t kvq_server_ui_len = ${len};\n")
