"""Acceleration methods and their baselines, declared by import path (importing this package imports none of them)."""
from core.registry import METHODS

METHODS.register("ar", "methods.teacher_samplers:ARSampler")
METHODS.register("ddim", "methods.teacher_samplers:DDIMSampler")
METHODS.register("mdlm", "methods.teacher_samplers:MDLMSampler")
METHODS.register("mar", "methods.teacher_samplers:MARSampler")
METHODS.register("jacobi", "methods.jacobi:Jacobi")
METHODS.register("sjd", "methods.sjd:SJD")
METHODS.register("dd", "methods.dd:DD")
METHODS.register("onestep*", "methods.onestep:OneStep")
METHODS.register("skip-n", "methods.skip:Skip")
METHODS.register("skip-scales", "methods.skip_scales:SkipScales")
METHODS.register("cspd", "methods.cspd:CSpD")
METHODS.register("ard", "methods.ard:ARD")
METHODS.register("step-distill", "methods.ard:StepDistill")
METHODS.register("kd", "methods.ard:KD")
METHODS.register("sdtt", "methods.sdtt:SDTT")
