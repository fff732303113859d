"""The wording each model is asked in: the judge's four rounds, the policy's instruction, ESCRAG-R1's prompts."""
