# Writes OUT, a C++ source defining hotops::bench::git_revision(): the short hash of the git
# repository whose top is SOURCE_DIR, or "unknown" when SOURCE_DIR is not the top of one (a source
# tarball, or a copy inside another project's repository), with "-dirty" when tracked files differ
# from that commit (what was built is not the commit alone). Run at every build; the file is
# rewritten only when the revision changed, so nothing rebuilds otherwise.
set(revision unknown)
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --show-toplevel
                OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(rc EQUAL 0)
  get_filename_component(top "${top}" REALPATH)
  get_filename_component(src "${SOURCE_DIR}" REALPATH)
  if(top STREQUAL src)
    execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                    OUTPUT_VARIABLE hash OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND hash)
      set(revision "${hash}")
      execute_process(COMMAND git -C "${SOURCE_DIR}" diff --quiet HEAD --
                      ERROR_QUIET RESULT_VARIABLE dirty)
      if(dirty EQUAL 1)
        set(revision "${hash}-dirty")
      endif()
    endif()
  endif()
endif()
set(text "// Generated at build time by cmake/HotopsGitRevision.cmake.\n#include \"bench/git_revision.h\"\nconst char* hotops::bench::git_revision() { return \"${revision}\"; }\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
