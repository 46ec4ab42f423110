# find_package(Strata) support: defines the imported target Strata::strata (libstrata.so with
# strata.h and strata.cuh on its include path). Installed by crates/strata-c/install.sh into
# PREFIX/lib/cmake/Strata, so PREFIX is three directories up.
get_filename_component(_strata_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET Strata::strata)
  add_library(Strata::strata SHARED IMPORTED)
  set_target_properties(Strata::strata PROPERTIES
    IMPORTED_LOCATION "${_strata_prefix}/lib/libstrata.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_strata_prefix}/include")
endif()

if(NOT EXISTS "${_strata_prefix}/lib/libstrata.so")
  set(Strata_FOUND FALSE)
  set(Strata_NOT_FOUND_MESSAGE "libstrata.so is missing from ${_strata_prefix}/lib: rerun install.sh")
endif()
unset(_strata_prefix)
