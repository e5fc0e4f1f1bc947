#!/bin/bash
# The --no-python worker: says what it creates, then touches <dir>/<RANK>.
set -e
echo "creating $1/$RANK"
touch "$1/$RANK"
