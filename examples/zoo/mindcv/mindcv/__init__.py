"""mindcv init"""
from . import data, loss, models, optim, scheduler, utils
from .data import *
from .loss import *
from .models import *
from .optim import *
from .scheduler import *
from .utils import *
from .version import __version__

__all__ = []
__all__.extend(data.__all__)
__all__.extend(loss.__all__)
__all__.extend(models.__all__)
__all__.extend(optim.__all__)
__all__.extend(scheduler.__all__)
