"""Validation: data-file schemas, comparison policies and adversarial inputs for kernel oracles."""
