"""Learning Rate Scheduler"""
from . import scheduler_factory
from .scheduler_factory import create_scheduler

__all__ = []
__all__.extend(scheduler_factory.__all__)
