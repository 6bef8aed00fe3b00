"""kbench.runtime: a Vulkan compute runtime with Kompute's Python API.

``import kbench.runtime as kp`` runs a Kompute (kp 0.9) program unchanged; see
docs/architecture.md for kbench's extensions and the Kompute defects fixed here.
"""
from .algorithm import Algorithm
from .compiler import compile_source
from .errors import (DeviceBusyError, DeviceLostError, OutOfDeviceMemoryError, ShaderCompileError, UnsupportedFeatureError,
                     ValidationError, VulkanError)
from .executables import PipelineExecutable
from .manager import Manager, list_devices
from .ops import (AccessFlags, OpAlgoDispatch, OpBase, OpMemoryBarrier, OpMult, OpTensorCopy, OpTensorCopyRegion,
                  OpTensorFill, OpTensorRead, OpTensorSyncDevice, OpTensorSyncLocal, OpTensorWrite, PipelineStageFlags)
from .sequence import Sequence
from .tensor import DataTypes, Tensor, TensorTypes

__all__ = [
    "AccessFlags", "Algorithm", "DataTypes", "DeviceBusyError", "DeviceLostError", "Manager", "OpAlgoDispatch", "OpBase",
    "OpMemoryBarrier", "OpMult", "OpTensorCopy", "OpTensorCopyRegion", "OpTensorFill", "OpTensorRead",
    "OpTensorSyncDevice", "OpTensorSyncLocal", "OpTensorWrite", "OutOfDeviceMemoryError", "PipelineExecutable",
    "PipelineStageFlags", "Sequence", "ShaderCompileError", "Tensor", "TensorTypes", "UnsupportedFeatureError",
    "ValidationError", "VulkanError", "compile_source", "list_devices",
]
