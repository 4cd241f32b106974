"""Admission policies: whether a missed chunk enters a tier at all."""

from policies.admission.base import AdmissionPolicy
from policies.admission.registry import admission_policy_names, make_admission_policy, register_admission_policy

__all__ = ["AdmissionPolicy", "admission_policy_names", "make_admission_policy", "register_admission_policy"]
