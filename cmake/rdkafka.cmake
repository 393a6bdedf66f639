# The librdkafka that libprosody links, privately (docs/DEVELOPMENT.md,
# "librdkafka"). Defines:
#   prosody_rdkafka       include directory, librdkafka.a (or the system's
#                         shared library) and its dependencies: for code that
#                         calls librdkafka itself (tests, benchmarks)
#   prosody_rdkafka_deps  the dependencies alone (ssl, sasl, zstd, lz4, zlib,
#                         curl): what a program linking libprosody.a adds
#   PROSODY_RDKAFKA_ARCHIVE  the static archive merged into libprosody, or ""
#   PROSODY_RDKAFKA_VERSION  its version
#   PROSODY_RDKAFKA_DEPS_PC  pkg-config names of its dependencies
#
# Which one, in order: PROSODY_RDKAFKA_PREFIX (a prefix holding
# lib/pkgconfig/rdkafka.pc), a system librdkafka of at least
# PROSODY_RDKAFKA_MIN, else scripts/librdkafka.sh (Debian's source package,
# built once into ~/.cache/prosody-deps).
set(PROSODY_RDKAFKA_MIN 2.10.0 CACHE STRING "Lowest librdkafka accepted")
set(PROSODY_RDKAFKA_PREFIX "" CACHE PATH
  "Prefix of the librdkafka to link (empty: system or scripts/librdkafka.sh)")

if(NOT PROSODY_RDKAFKA_PREFIX)
  pkg_check_modules(SYS_RDKAFKA QUIET "rdkafka>=${PROSODY_RDKAFKA_MIN}")
  if(SYS_RDKAFKA_FOUND)
    pkg_get_variable(sys_rdk_prefix rdkafka prefix)
    set(PROSODY_RDKAFKA_PREFIX "${sys_rdk_prefix}" CACHE PATH "" FORCE)
  else()
    # ThreadSanitizer builds take the C11-threads flavour, as a shared
    # library (below): tests/tsan.supp ignores the locks librdkafka.so.1
    # takes itself, and its C11 locks reach TSan through tsan_shim.c.
    set(rdk_flavour "")
    if(PROSODY_SANITIZE MATCHES "thread")
      set(rdk_flavour c11)
    endif()
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env PROSODY_RDKAFKA_FLAVOUR=${rdk_flavour}
        ${CMAKE_CURRENT_LIST_DIR}/../scripts/librdkafka.sh
      OUTPUT_VARIABLE rdk_out RESULT_VARIABLE rdk_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rdk_rc EQUAL 0)
      message(FATAL_ERROR "no librdkafka >= ${PROSODY_RDKAFKA_MIN}: "
        "scripts/librdkafka.sh failed (see above)")
    endif()
    string(REGEX REPLACE ".*\n" "" rdk_out "${rdk_out}")
    set(PROSODY_RDKAFKA_PREFIX "${rdk_out}" CACHE PATH "" FORCE)
  endif()
endif()

# The chosen prefix's rdkafka.pc, read without touching PKG_CONFIG_PATH for
# the rest of the build.
find_file(rdk_pc rdkafka.pc
  PATHS ${PROSODY_RDKAFKA_PREFIX}/lib/pkgconfig
        ${PROSODY_RDKAFKA_PREFIX}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/pkgconfig
        ${PROSODY_RDKAFKA_PREFIX}/lib64/pkgconfig
  NO_DEFAULT_PATH)
if(NOT rdk_pc)
  message(FATAL_ERROR "PROSODY_RDKAFKA_PREFIX=${PROSODY_RDKAFKA_PREFIX} has no rdkafka.pc")
endif()
get_filename_component(rdk_pcdir "${rdk_pc}" DIRECTORY)
unset(rdk_pc CACHE)
set(saved_pcp "$ENV{PKG_CONFIG_PATH}")
set(ENV{PKG_CONFIG_PATH} "${rdk_pcdir}")
execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --modversion rdkafka
  OUTPUT_VARIABLE PROSODY_RDKAFKA_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --variable=libdir rdkafka
  OUTPUT_VARIABLE rdk_libdir OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --variable=includedir rdkafka
  OUTPUT_VARIABLE rdk_incdir OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --print-requires-private rdkafka
  OUTPUT_VARIABLE rdk_requires OUTPUT_STRIP_TRAILING_WHITESPACE)
set(ENV{PKG_CONFIG_PATH} "${saved_pcp}")
if(PROSODY_RDKAFKA_VERSION VERSION_LESS PROSODY_RDKAFKA_MIN)
  message(FATAL_ERROR "librdkafka ${PROSODY_RDKAFKA_VERSION} at "
    "${PROSODY_RDKAFKA_PREFIX} is older than ${PROSODY_RDKAFKA_MIN}")
endif()

# Its dependencies stay dynamic system libraries.
string(REGEX REPLACE "[ \t\n]+" ";" rdk_requires "${rdk_requires}")
set(PROSODY_RDKAFKA_DEPS_PC "")
foreach(r ${rdk_requires})
  string(REGEX REPLACE "[<>=].*" "" r "${r}")
  if(r)
    list(APPEND PROSODY_RDKAFKA_DEPS_PC ${r})
  endif()
endforeach()
add_library(prosody_rdkafka_deps INTERFACE)
if(PROSODY_RDKAFKA_DEPS_PC)
  pkg_check_modules(RDKAFKA_DEPS REQUIRED IMPORTED_TARGET ${PROSODY_RDKAFKA_DEPS_PC})
  target_link_libraries(prosody_rdkafka_deps INTERFACE PkgConfig::RDKAFKA_DEPS)
endif()
target_link_libraries(prosody_rdkafka_deps INTERFACE Threads::Threads m dl rt)
target_include_directories(prosody_rdkafka_deps SYSTEM INTERFACE ${rdk_incdir})

add_library(prosody_rdkafka INTERFACE)
if(EXISTS "${rdk_libdir}/librdkafka.a" AND NOT PROSODY_SANITIZE MATCHES "thread")
  set(PROSODY_RDKAFKA_ARCHIVE "${rdk_libdir}/librdkafka.a")
  target_link_libraries(prosody_rdkafka INTERFACE ${PROSODY_RDKAFKA_ARCHIVE}
    prosody_rdkafka_deps)
else()
  set(PROSODY_RDKAFKA_ARCHIVE "")
  # A shared system library: then prosody.pc names it among its own. (The
  # TSan flavour is a build-tree affair: found by its rpath.)
  if(SYS_RDKAFKA_FOUND)
    list(APPEND PROSODY_RDKAFKA_DEPS_PC rdkafka)
  endif()
  target_link_libraries(prosody_rdkafka INTERFACE ${rdk_libdir}/librdkafka.so
    prosody_rdkafka_deps)
endif()
# Whether it runs its threads on glibc's C11 <threads.h> (Debian's builds
# do), which ThreadSanitizer cannot see: TSan builds then link
# src/util/tsan_shim.c. Ours (scripts/librdkafka.sh) brings its own
# thrd_* over pthreads (tinycthread) and needs no shim.
set(PROSODY_RDKAFKA_C11_THREADS TRUE)
if(PROSODY_RDKAFKA_ARCHIVE)
  execute_process(COMMAND ${CMAKE_NM} -g --defined-only ${PROSODY_RDKAFKA_ARCHIVE}
    OUTPUT_VARIABLE rdk_syms ERROR_QUIET)
  if(rdk_syms MATCHES "T thrd_create")
    set(PROSODY_RDKAFKA_C11_THREADS FALSE)
  endif()
elseif(EXISTS "${rdk_libdir}/librdkafka.so")
  execute_process(COMMAND ${CMAKE_NM} -D --defined-only ${rdk_libdir}/librdkafka.so
    OUTPUT_VARIABLE rdk_syms ERROR_QUIET)
  if(rdk_syms MATCHES "T thrd_create")
    set(PROSODY_RDKAFKA_C11_THREADS FALSE)
  endif()
endif()
message(STATUS "librdkafka ${PROSODY_RDKAFKA_VERSION} from "
  "${PROSODY_RDKAFKA_PREFIX} (${PROSODY_RDKAFKA_ARCHIVE})")
