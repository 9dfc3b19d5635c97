# test_layers: each library sees only the headers it may use (docs/design.md,
# "Folders and what they may use"; fb_layer in the top CMakeLists.txt).
# For each case, a file that includes one header is compiled (-fsyntax-only)
# with the include directories of one target: a header the target may use
# must compile, any other must fail for want of the file. A case that also
# names a symbol takes its address after the include: "ok", the header
# declares it; "no", the header compiles but does not declare it (an
# interface header that keeps another folder's internals out of sight).
# Then no file of optimizer/, codegen/, runtime/ or engine/ may include the
# front end's headers (below).
#   cmake -DCC=compiler -DSRC=source-root -DDIRS="target=dir|dir...;..." -P test_layers.cmake
# DIRS gives each target's include directories (its INCLUDE_DIRECTORIES).

# target  header  ok|no  [symbol]
set(cases
  "fusebox_base base/base.h ok"
  "fusebox_base base/map.h ok fb_map_put"
  "fusebox_base ir/arith.h no"
  "fusebox_base ir/ir_internal.h no"
  "fusebox_base lang/lang_internal.h no"
  "fusebox_ir fusebox/ir.h ok"
  "fusebox_ir base/map.h ok"
  "fusebox_ir lang/lang_internal.h no"
  "fusebox_lang lang/lang_internal.h ok"
  "fusebox_lang ir/arith.h ok fb_arith_binop"
  "fusebox_lang base/map.h ok"
  "fusebox_lang ir/ir_internal.h no"
  "fusebox_lang optimizer/optimizer.h no"
  "fusebox_lang codegen/codegen.h no"
  "fusebox_lang runtime/runtime.h no"
  "fusebox_opt lang/lang_internal.h no"
  "fusebox_codegen lang/lang_internal.h no"
  "fusebox_runtime lang/lang_internal.h no"
  "fusebox_engine lang/lang_internal.h no"
  "fusebox_ir base/base.h ok"
  "fusebox_ir optimizer/optimizer.h no"
  "fusebox_ir runtime/runtime.h no"
  "fusebox_ir codegen/codegen.h no"
  "fusebox_opt optimizer/sfg.h ok"
  "fusebox_opt ir/arith.h ok"
  "fusebox_opt base/base.h ok"
  "fusebox_opt codegen/codegen.h no"
  "fusebox_opt runtime/runtime.h no"
  "fusebox_opt ir/ir_internal.h no"
  "fusebox_opt fusebox/engine.h no"
  "fusebox_opt fusebox/ir.h ok fb_layout_equal"
  "fusebox_opt fusebox/client.h no"
  "fusebox_codegen codegen/codegen.h ok"
  "fusebox_codegen optimizer/optimizer.h no"
  "fusebox_codegen runtime/runtime.h no"
  "fusebox_runtime runtime/runtime.h ok"
  "fusebox_runtime runtime/cuda.h ok fb_cuda_launch"
  "fusebox_runtime runtime/cpu.h ok fb_cpu_run_sparse"
  "fusebox_runtime optimizer/optimizer.h no"
  "fusebox_runtime codegen/cg_internal.h no"
  "fusebox_runtime engine/internal.h no"
  "fusebox_engine runtime/runtime.h ok"
  "fusebox_engine runtime/runtime.h ok fb_device_ops_for"
  "fusebox_engine runtime/runtime.h no fb_cuda_ops"
  "fusebox_engine runtime/runtime.h no fb_cuda_launch"
  "fusebox_engine runtime/cuda.h no"
  "fusebox_engine runtime/runtime.h no fb_cpu_device_new"
  "fusebox_engine runtime/runtime.h no fb_cpu_run_sparse"
  "fusebox_engine runtime/cpu.h no"
  "fusebox_engine optimizer/optimizer.h ok fb_opt_flush"
  "fusebox_engine optimizer/optimizer.h no fb_sfg_rebuild"
  "fusebox_engine optimizer/optimizer.h no fb_bank_new"
  "fusebox_engine optimizer/sfg.h no"
  "fusebox_engine codegen/codegen.h ok"
  "fusebox_engine proto/convert.h no"
  "fusebox_engine server/server.h no"
  "fusebox_engine runtime/cuda_drv.h no"
  "fusebox_proto base/base.h ok"
  "fusebox_proto runtime/runtime.h no"
  "fusebox_proto optimizer/optimizer.h no"
  "fusebox_server fusebox/engine.h ok"
  "fusebox_server proto/wire.h ok fbp_bb_copy"
  "fusebox_server runtime/runtime.h no"
  "fusebox_server runtime/cuda.h no"
  "fusebox_server optimizer/sfg.h no"
  "fusebox_server optimizer/optimizer.h no"
  "fusebox_server engine/internal.h no"
  "fusebox_server client/client_internal.h no"
  "fusebox_client base/base.h ok"
  "fusebox_client fusebox/client.h ok fb_remote_checkpoint"
  "fusebox_client fusebox/engine.h no"
  "fusebox_client fusebox/codestore.h no"
  "fusebox_shared fusebox/engine.h no"
  "fusebox_shared fusebox/client.h ok"
  "fusebox_engine fusebox/client.h no"
  "fusebox_engine fusebox/lang.h no"
  "fusebox_codegen fusebox/engine.h no"
  "fusebox_runtime fusebox/engine.h no"
  "fusebox_ir fusebox/engine.h no"
  "fusebox fusebox/engine.h ok fb_session_checkpoint"
  "fusebox fusebox/client.h ok"
  "fusebox_client proto/wire.h ok fbp_bb_copy"
  "fusebox_client runtime/runtime.h no"
  "fusebox_client engine/internal.h no"
  "fusebox_client server/server.h no"
  "fusebox base/base.h ok"
  "fusebox optimizer/optimizer.h no"
  "fusebox runtime/runtime.h no"
  "fusebox engine/internal.h no"
  "fusebox client/client_internal.h no"
  "fusebox codegen/codegen.h no")

foreach(entry ${DIRS})
  string(FIND "${entry}" "=" eq)
  string(SUBSTRING "${entry}" 0 ${eq} t)
  math(EXPR from "${eq} + 1")
  string(SUBSTRING "${entry}" ${from} -1 dirs)
  string(REPLACE "|" ";" dirs "${dirs}")
  set(inc_${t})
  foreach(d ${dirs})
    list(APPEND inc_${t} "-I${d}")
  endforeach()
endforeach()

set(work ${CMAKE_CURRENT_BINARY_DIR}/test_layers)
file(MAKE_DIRECTORY ${work})
set(failures 0)
set(n 0)
foreach(c ${cases})
  string(REPLACE " " ";" c "${c}")
  list(GET c 0 t)
  list(GET c 1 h)
  list(GET c 2 want)
  list(LENGTH c len)
  set(sym)
  if(len GREATER 3)
    list(GET c 3 sym)
  endif()
  if(NOT DEFINED inc_${t})
    message(SEND_ERROR "no include directories given for target ${t}")
    math(EXPR failures "${failures} + 1")
    continue()
  endif()
  math(EXPR n "${n} + 1")
  set(src ${work}/case${n}.c)
  if(sym)
    file(WRITE ${src} "#include \"${h}\"\nvoid *fb_layers_case(void) { return (void *)&${sym}; }\n")
  else()
    file(WRITE ${src} "#include \"${h}\"\nint fb_layers_case;\n")
  endif()
  execute_process(COMMAND ${CC} -fsyntax-only ${inc_${t}} ${src}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(sym)
    if(want STREQUAL "ok" AND NOT rc EQUAL 0)
      message(SEND_ERROR "${t}: ${h} should declare ${sym}, but this does not compile:\n${out}")
      math(EXPR failures "${failures} + 1")
    elseif(want STREQUAL "no" AND rc EQUAL 0)
      message(SEND_ERROR "${t}: ${h} declares ${sym}, which it should keep out of sight")
      math(EXPR failures "${failures} + 1")
    elseif(want STREQUAL "no" AND NOT (out MATCHES "undeclared" AND out MATCHES "${sym}"))
      message(SEND_ERROR "${t}: ${h} with ${sym} failed, but not for want of ${sym}:\n${out}")
      math(EXPR failures "${failures} + 1")
    endif()
  elseif(want STREQUAL "ok" AND NOT rc EQUAL 0)
    message(SEND_ERROR "${t} may include ${h}, but it does not compile:\n${out}")
    math(EXPR failures "${failures} + 1")
  elseif(want STREQUAL "no" AND rc EQUAL 0)
    message(SEND_ERROR "${t} may not include ${h}, yet it compiles")
    math(EXPR failures "${failures} + 1")
  elseif(want STREQUAL "no" AND NOT out MATCHES "${h}: No such file")
    message(SEND_ERROR "${t} including ${h} failed, but not for want of the file:\n${out}")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()
# The front end's public header (fusebox/lang.h, and fusebox/client.h,
# which includes it) is out of those folders' include roots (above); as a
# second check, no file of the folders below the front end may name it, nor
# any header of lang/ (they do not link fusebox_lang).
foreach(dir optimizer codegen runtime engine)
  file(GLOB_RECURSE files ${SRC}/${dir}/*.c ${SRC}/${dir}/*.h)
  if(NOT files)
    message(SEND_ERROR "no sources found in ${SRC}/${dir}")
    math(EXPR failures "${failures} + 1")
  endif()
  foreach(f ${files})
    math(EXPR n "${n} + 1")
    file(STRINGS ${f} bad REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<](fusebox/lang\\.h|fusebox/client\\.h|lang/)")
    if(bad)
      file(RELATIVE_PATH rel ${SRC} ${f})
      message(SEND_ERROR "${rel} includes the .fbk front end (${bad}); ${dir}/ is below it")
      math(EXPR failures "${failures} + 1")
    endif()
  endforeach()
endforeach()

# The front end's first stages depend on nothing above them: the lexer
# includes only its own header, the diagnostics and the base; the
# diagnostics only the IR's public header (fb_diags) and the front end's.
set(lang_only
  "lang/lang_lex.c=lang_lex.h|lang_diag.h|base/base.h|base/map.h|base/strbuf.h"
  "lang/lang_lex.h=lang_diag.h"
  "lang/lang_diag.h=fusebox/ir.h"
  "lang/lang_diag.c=lang_diag.h|fusebox/lang.h")
foreach(entry ${lang_only})
  string(REPLACE "=" ";" entry "${entry}")
  list(GET entry 0 f)
  list(GET entry 1 allowed)
  string(REPLACE "|" ";" allowed "${allowed}")
  math(EXPR n "${n} + 1")
  if(NOT EXISTS ${SRC}/${f})
    message(SEND_ERROR "${f} is missing")
    math(EXPR failures "${failures} + 1")
    continue()
  endif()
  file(STRINGS ${SRC}/${f} incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line ${incs})
    string(REGEX REPLACE "^[^\"]*\"([^\"]*)\".*$" "\\1" h "${line}")
    list(FIND allowed "${h}" at)
    if(at EQUAL -1)
      message(SEND_ERROR "${f} includes ${h}; it may include only ${allowed}")
      math(EXPR failures "${failures} + 1")
    endif()
  endforeach()
endforeach()

if(failures)
  message(FATAL_ERROR "test_layers: ${failures} of ${n} cases failed")
endif()
message(STATUS "test_layers: ${n} cases, each library sees what it may use and nothing else")
