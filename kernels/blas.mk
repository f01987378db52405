# OpenBLAS for the CPU backend's matmuls, for the Makefile and kernels/cuda.mk alike: NO_BLAS=1
# builds without it (plain-loop matmuls). The OpenMP build of OpenBLAS, where installed, shares our
# OpenMP threads; the pthread build would run its own threads beside them and the two pools fight
# over the cores.
OPENBLAS_OMP = /usr/lib/x86_64-linux-gnu/openblas-openmp
ifeq ($(NO_BLAS),1)
  BLAS_CFLAGS = -DNO_BLAS
  BLAS_LIBS =
else
  BLAS_CFLAGS =
  # asked when a recipe links, not when make starts: scripts/prerequisites.sh may just have installed it
  BLAS_LIBS = $(if $(shell test -e $(OPENBLAS_OMP)/libopenblas.so && echo yes),-L$(OPENBLAS_OMP) -Xlinker -rpath=$(OPENBLAS_OMP)) -lopenblas
endif
