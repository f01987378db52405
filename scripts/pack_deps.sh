#!/usr/bin/env bash
# Packs into .deps/ what scripts/gpu_check.sh needs from the system on a GPU machine that has
# the CUDA toolkit but no GoogleTest, no OpenMPI and no package manager (`gpu_check.sh --pack`
# runs this on a Debian machine that has them; a device call carries .deps/ beside the working
# tree, 64 MiB at most for both):
#   include/gtest, lib/libgtest.a   GoogleTest
#   openmpi/   OpenMPI's runtime, started relocated: mpirun, mpicxx and mpi.h to build, its
#              libraries with every library they load but the C and C++ runtimes' (PMIx,
#              libevent, hwloc, ...), the components that need nothing more (shared memory and
#              TCP: no InfiniBand, UCX, OFI or PSM), its help and wrapper data files
#   env.sh     `source .deps/env.sh` points PATH, LD_LIBRARY_PATH and OpenMPI's and PMIx's
#              installation directories (OPAL_PREFIX, ...) at openmpi/, wherever .deps/ now is
# Without OpenMPI here only GoogleTest is packed; gpu_check.sh then builds NO_MPI=1.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.deps
rm -rf "$deps" && mkdir -p "$deps/include" "$deps/lib"
cp -r /usr/include/gtest "$deps/include/"
cp /usr/lib/x86_64-linux-gnu/libgtest.a "$deps/lib/"

if command -v ompi_info >/dev/null; then
    ompi_path() { ompi_info --path all --parsable | sed -n "s/^path:$1://p" | head -1; }
    bindir=$(ompi_path bindir) libdir=$(ompi_path libdir) incdir=$(ompi_path incdir)
    pkglibdir=$(ompi_path pkglibdir) pkgdatadir=$(ompi_path pkgdatadir) sysconfdir=$(ompi_path sysconfdir)
    mpi=$deps/openmpi
    mkdir -p "$mpi/bin" "$mpi/lib/openmpi" "$mpi/lib/pmix" "$mpi/include" "$mpi/share" "$mpi/etc"

    # the libraries packed; a component that loads any other is left out
    packed='^lib(mpi|mpi_cxx|open-pal|open-rte|mca_common_[a-z]+|pmix|event_[a-z]+-2\.1|hwloc|munge|udev|z)\.so'
    runtime='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libstdc\+\+|libgcc_s)\.so'
    libs=$(mktemp); trap 'rm -f "$libs"' EXIT
    # loads FILE: every library FILE loads, as "soname path", but the C and C++ runtimes
    loads() { ldd "$1" | awk '$2 == "=>" { print $1, $3 }' | grep -vE "$runtime" || true; }
    # keep FILE DIR: copies FILE into DIR and notes what it loads
    keep() { cp -L "$1" "$2/"; loads "$1" >>"$libs"; }
    # component FILE DIR: keeps the component FILE if all it loads is packed
    component() { if ! loads "$1" | grep -vqE "$packed"; then keep "$1" "$2"; fi; }
    for prog in orterun orted opal_wrapper; do keep "$bindir/$prog" "$mpi/bin"; done
    ln -s orterun "$mpi/bin/mpirun"
    ln -s opal_wrapper "$mpi/bin/mpicxx"
    # mpicxx links libmpi_cxx too
    { echo "libmpi_cxx.so.40 $libdir/libmpi_cxx.so"; loads "$libdir/libmpi_cxx.so"; } >>"$libs"
    for c in "$pkglibdir"/mca_*.so; do component "$c" "$mpi/lib/openmpi"; done
    # PMIx, which mpirun starts the ranks with: its own components and help files
    pmix=$(dirname "$(dirname "$(readlink -f "$(awk '$1 == "libpmix.so.2" { print $2 }' "$libs" | head -1)")")")
    for c in "$pmix"/lib/pmix/*.so; do component "$c" "$mpi/lib/pmix"; done
    cp -r "$pmix/share/pmix" "$mpi/share/"
    sort -u "$libs" | while read -r soname path; do cp -L "$path" "$mpi/lib/$soname"; done
    ln -s libmpi.so.40 "$mpi/lib/libmpi.so"
    ln -s libmpi_cxx.so.40 "$mpi/lib/libmpi_cxx.so"
    cp "$incdir"/*.h "$mpi/include/"
    cp -r "$pkgdatadir" "$mpi/share/openmpi"
    cp -r "$sysconfdir"/. "$mpi/etc/"
fi

cat >"$deps/env.sh" <<'EOF'
# Sourced (bash): OpenMPI from .deps/openmpi, relocated (scripts/pack_deps.sh made it)
OPAL_PREFIX=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/openmpi
if [ -d "$OPAL_PREFIX" ]; then
    export OPAL_PREFIX PMIX_INSTALL_PREFIX=$OPAL_PREFIX
    export PMIX_PKGLIBDIR=$OPAL_PREFIX/lib/pmix PMIX_PKGDATADIR=$OPAL_PREFIX/share/pmix
    export OPAL_LIBDIR=$OPAL_PREFIX/lib OPAL_INCLUDEDIR=$OPAL_PREFIX/include OPAL_PKGLIBDIR=$OPAL_PREFIX/lib/openmpi
    export OPAL_PKGDATADIR=$OPAL_PREFIX/share/openmpi OPAL_SYSCONFDIR=$OPAL_PREFIX/etc
    export PATH=$OPAL_PREFIX/bin:$PATH LD_LIBRARY_PATH=$OPAL_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    unset OPAL_PREFIX
fi
EOF
echo "packed $(du -sh "$deps" | cut -f1) into $deps/ (carry it to the GPU machine)"
