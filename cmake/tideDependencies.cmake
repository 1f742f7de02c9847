# Dependencies come from Debian packages and the CUDA Toolkit under /usr/local/cuda.
# Nothing here downloads anything.
find_package(Threads REQUIRED)
find_package(MPI QUIET COMPONENTS CXX)
# OpenBLAS ships a CMake config on Debian; CBLAS symbols live in libopenblas.
find_package(OpenBLAS CONFIG QUIET)

if(TIDE_ENABLE_CUDA)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
endif()
