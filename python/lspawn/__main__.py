"""`python -m lspawn ARGS...`: runs the native `lspawn ARGS...` (docs/cli.md) of this install.

The process becomes the launcher (exec, same pid), with LSPAWN_HOME set to this package's folder,
where the launcher finds its helper files (the guardian, the --preload server and its library).
"""
import os
import sys

from ._paths import lspawn_binary, package_dir


def main(argv):
    try:
        binary = lspawn_binary()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    env = dict(os.environ, LSPAWN_HOME=package_dir())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(binary, ["lspawn", *argv], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
