"""KL estimators between the policy and a reference policy, per token."""

from __future__ import annotations

from torch import Tensor


def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): `exp(ref_logps - logps) - (ref_logps - logps) - 1`.

    Non-negative, zero where the two log-probabilities agree, and unbiased for the reverse KL when the tokens are
    sampled from pi. Gradients flow through `logps` (and `ref_logps` if it requires grad).

    Args:
        logps: `(B, T)` log-probabilities of the sampled tokens under the policy being trained.
        ref_logps: `(B, T)` log-probabilities of the same tokens under the reference model.

    Returns:
        `(B, T)`; padded positions are not masked here.
    """
    log_ref_ratio = ref_logps - logps
    return log_ref_ratio.exp() - log_ref_ratio - 1
