"""Utility Tools"""
from .amp import *
from .callbacks import *
from .checkpoint_manager import *
from .download import *
from .logger import *
from .path import *
from .random import *
from .reduce_manager import *
from .train_step import *
from .trainer_factory import *
