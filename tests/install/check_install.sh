#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# check_install.sh BUILD_DIR SOURCE_DIR - installs the build into a scratch
# root, then checks what a user gets: the header, libloom.so exporting only
# loom* symbols, libloom.a, loom.pc, and that an example compiles with
# pkg-config's flags and runs on two ranks under the installed loomrun.
set -eu
build=$1
src=$2
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --destdir "$dest" --no-rebuild >/dev/null
pc=$(find "$dest" -name loom.pc | head -n 1)
[ -n "$pc" ] || { echo "loom.pc was not installed"; exit 1; }
lib=$(find "$dest" -name 'libloom.so' | head -n 1)
[ -n "$(find "$dest" -name 'libloom.a')" ] || { echo "libloom.a was not installed"; exit 1; }
for h in loom.h loom_echo.h loom_moe.h loom_shard.h; do
    [ -n "$(find "$dest" -name "$h")" ] || { echo "$h was not installed"; exit 1; }
done
leaked=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^loom[A-Z]' || true)
if [ -n "$leaked" ]; then
    echo "libloom.so exports non-API symbols:"; echo "$leaked"; exit 1
fi
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$dest" pkg-config --cflags --libs loom)
cc -std=c11 -Wall -Wextra -Werror "$src/examples/01_init_allreduce.c" $flags -o "$dest/example"
loomrun=$(find "$dest" -name loomrun -type f | head -n 1)
LD_LIBRARY_PATH=$(dirname "$lib") "$loomrun" -n 2 "$dest/example" | grep -q "sum over 2 ranks: 1 2 4 6"
echo "install ok: $(nm -D --defined-only "$lib" | wc -l) exported symbols"
