"""The statistics of one source of one tensor, as the engine (`numerics.Accumulator`) yields them and the
health pass, its report and the app's one-tensor statistics show them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stats:
    """One source of one tensor. min/max/mean/std/absmax are over the finite values; NaN if none are."""

    numel: int
    nan: int
    pos_inf: int
    neg_inf: int
    zeros: int
    minimum: float
    maximum: float
    absmax: float
    mean: float
    std: float  # population standard deviation (torch's `std(unbiased=False)`)
    norm: float  # L2 norm of the finite values
    zero_rows: int | None = None  # rows (first axis) that are zero throughout; exp_avg_sq of 2-D+ tensors

    @property
    def inf(self) -> int:
        return self.pos_inf + self.neg_inf

    @property
    def finite(self) -> int:
        return self.numel - self.nan - self.inf

    @property
    def all_zero(self) -> bool:
        return self.numel > 0 and self.zeros == self.numel

    @property
    def constant(self) -> bool:
        """Every value equal (and finite), more than one of them."""
        return self.numel > 1 and self.finite == self.numel and self.minimum == self.maximum
