"""ListOps configs (LRA ``listops/configs``; SimpleTRON appendix A)."""
