# Decides whether the NCCL collectives are built (HOTOPS_WITH_NCCL = AUTO / ON / OFF) and sets
# HOTOPS_HAVE_NCCL and the NCCL::nccl target. NCCL needs the CUDA backend. It is looked for in
# NCCL_ROOT, the CUDA toolkit's tree, the system's folders and the `nvidia-nccl-cu13` wheel (the one
# tools/deps.sh installs into ~/.local/share/hotops/nccl, or one in Python's site-packages).
# ON fails loudly when NCCL (2.18 or later: ncclCommSplit) is missing; AUTO builds without it.
set(HOTOPS_HAVE_NCCL OFF)
string(TOUPPER "${HOTOPS_WITH_NCCL}" _want_nccl)
if(NOT _want_nccl MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "HOTOPS_WITH_NCCL must be AUTO, ON or OFF (got '${HOTOPS_WITH_NCCL}')")
endif()
if(_want_nccl STREQUAL "OFF")
  message(STATUS "hotops: NCCL collectives OFF (HOTOPS_WITH_NCCL=OFF)")
  return()
endif()
if(NOT HOTOPS_HAVE_CUDA)
  if(_want_nccl STREQUAL "ON")
    message(FATAL_ERROR "hotops: HOTOPS_WITH_NCCL=ON needs the CUDA backend, which is OFF")
  endif()
  message(STATUS "hotops: NCCL collectives OFF (no CUDA backend)")
  return()
endif()

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
if(DEFINED ENV{XDG_DATA_HOME})
  list(APPEND _nccl_hints $ENV{XDG_DATA_HOME}/hotops/nccl/nvidia/nccl)
elseif(DEFINED ENV{HOME})
  list(APPEND _nccl_hints $ENV{HOME}/.local/share/hotops/nccl/nvidia/nccl)
endif()
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  # nvidia is a namespace package: the wheel's folder is nvidia.nccl.__path__[0].
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
                  OUTPUT_VARIABLE _wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND _wheel)
    list(APPEND _nccl_hints ${_wheel})
  endif()
endif()
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include include/x86_64-linux-gnu)
# The library beside the header first, so that the two agree; the wheel ships libnccl.so.2
# without the libnccl.so link.
if(NCCL_INCLUDE_DIR)
  get_filename_component(_nccl_prefix "${NCCL_INCLUDE_DIR}/.." ABSOLUTE)
  list(PREPEND _nccl_hints ${_nccl_prefix})
endif()
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)
set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*" "\\1" _maj "${_v}")
  string(REGEX REPLACE ".*NCCL_MINOR +([0-9]+).*" "\\1" _min "${_v}")
  string(REGEX REPLACE ".*NCCL_PATCH +([0-9]+).*" "\\1" _pat "${_v}")
  set(NCCL_VERSION "${_maj}.${_min}.${_pat}")
endif()

set(_missing "")
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  set(_missing "NCCL (nccl.h and libnccl; tools/deps.sh installs it, or set NCCL_ROOT)")
elseif(NCCL_VERSION VERSION_LESS 2.18)
  set(_missing "NCCL 2.18 or later (found ${NCCL_VERSION} in ${NCCL_INCLUDE_DIR})")
endif()
if(_missing STREQUAL "")
  set(HOTOPS_HAVE_NCCL ON)
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
  message(STATUS "hotops: NCCL collectives ON (NCCL ${NCCL_VERSION}, ${NCCL_LIBRARY})")
elseif(_want_nccl STREQUAL "ON")
  message(FATAL_ERROR "hotops: HOTOPS_WITH_NCCL=ON but ${_missing} was not found")
else()
  message(STATUS "hotops: NCCL collectives OFF (${_missing} not found); multi-GPU entries say why they do not run")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
