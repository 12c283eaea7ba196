"""Scheduling: plans (which device runs what, and why) and the executor that runs them."""

from .errors import CapabilityError, DeviceRunError, DeviceSelectionError
from .executor import Executor
from .fragment import Fragment, split_fragments
from .plan import Copy, Placement, Plan, Residence, make_plan
from .reserve import Reservation, check_together, reserve, reserve_together

__all__ = ["CapabilityError", "DeviceRunError", "DeviceSelectionError", "Executor", "Fragment", "split_fragments",
           "Copy", "Placement", "Plan", "Residence", "make_plan", "Reservation", "check_together", "reserve",
           "reserve_together"]
