"""Doctor tests: rules raise instead of turning a bug into a TW900 finding."""

import os

os.environ["TRAINWISE_DOCTOR_STRICT"] = "1"

import trainwise.doctor.analysis as _analysis

_analysis.STRICT = True
