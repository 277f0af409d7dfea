"""python -m lspawn.distributed build [--out DIR] [-v]: builds the backend's shim for the installed torch.
python -m lspawn.distributed check: says which shim the installed torch gets, or why none."""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lspawn.distributed")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the torch.distributed backend's shim against the installed torch")
    b.add_argument("--out", help="folder for the shim (default: $LSPAWN_BACKEND_SHIM_DIR or ~/.cache/lspawn/shims)")
    b.add_argument("-v", "--verbose", action="store_true", help="print the compiler's command line")
    b.add_argument("--torch-dir", help="build against this unpacked torch/ folder instead of the imported torch")
    sub.add_parser("check", help="load the shim for the installed torch and say which it is")
    args = parser.parse_args(argv)
    from . import _build
    if args.command == "build":
        try:
            path = _build.build(args.out, args.verbose, args.torch_dir)
        except _build.BuildError as e:
            print(e, file=sys.stderr)
            return 1
        print(path)
        return 0
    import lspawn.distributed as ld
    try:
        shim = ld._load()
    except ld.ShimMissingError as e:
        print(e, file=sys.stderr)
        return 1
    print(shim.__file__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
