# Turns a binary file into a C source holding it as a byte array:
#   cmake -DIN=file.bc -DOUT=file.c -DNAME=symbol -P embed.cmake
# defines `const unsigned char NAME[]` and `const unsigned long NAME_size`.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* Generated from ${IN} by codegen/rt/embed.cmake: do not edit. */\n"
  "const unsigned char ${NAME}[] = {\n${body}\n};\n"
  "const unsigned long ${NAME}_size = ${bytes};\n")
