"""The seeds of the documented inputs (``csagate.reference.inputs`` draws with them; the gate's
cases name them). Plain data: importing this imports no torch."""

INPUT_SEED = 1234
GRAD_SEED = 7
PAD_GRAD_SEED = 11
PAD_TOKEN_SEED = 13
