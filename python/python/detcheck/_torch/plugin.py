"""PyTorch as a plugin of the start-up hook (``detcheck._core.contract.Plugin``): the recorder
starts once the program imports ``torch``. Nothing of torch is imported here: the front end's
modules are imported when the hook calls them."""

from .._core.contract import Plugin


def _install_evidence() -> None:
    from .frontend import install_evidence

    install_evidence()


def _start(state):
    from .auto import start

    return start(state)


PLUGIN = Plugin("torch", "torch's generators and data loaders", _install_evidence, _start)
