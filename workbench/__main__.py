"""`workbench` (the installed command) and `python -m workbench`: the stop handler goes in
before the CLI loads torch, so a Ctrl-C during start-up is a clean stop (workbench.stopping)."""

from workbench import stopping
from workbench.importing import loading, own_process


def main() -> None:
    stopping.install_handlers()
    own_process()
    with loading("workbench.cli"):
        from workbench import cli  # after the handler: the CLI loads torch

    cli.OWN_PROCESS = True
    cli.main()


if __name__ == "__main__":
    main()
