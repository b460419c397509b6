#!/bin/sh
# bench/records/run.sh [N [ROUNDS]] - builds the C baseline and runs the
# records() throughput bench on LuaJIT (needs root for the tracepoint).
set -e
cd "$(dirname "$0")/../.."
mkdir -p build/bench
cc -O2 -fPIC -shared -Wall -Wextra -Werror bench/records/cdrain.c -o build/bench/cdrain.so
make -s
LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit bench/records/bench.lua "$@"
