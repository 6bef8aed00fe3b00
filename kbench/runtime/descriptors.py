"""Descriptor sets from shared pools (one pool per Algorithm, as Kompute does, costs an object
per dispatch configuration and runs into driver limits in long loops)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import _vk
from ._vk import vk

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager

SETS_PER_POOL = 256
DESCRIPTORS_PER_POOL = SETS_PER_POOL * 8


class DescriptorAllocator:
    """Allocates storage-buffer descriptor sets, adding pools as they fill up."""

    def __init__(self, mgr: "Manager"):
        self.mgr = mgr
        self.pools: list = []
        self.owner: dict = {}  # set handle id -> pool

    def _new_pool(self):
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=DESCRIPTORS_PER_POOL)
        with _vk.call("vkCreateDescriptorPool"):
            pool = vk.vkCreateDescriptorPool(self.mgr._device, vk.VkDescriptorPoolCreateInfo(
                flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=SETS_PER_POOL,
                poolSizeCount=1, pPoolSizes=[size]), None)
        self.pools.append(pool)
        return pool

    def allocate(self, layout, buffers: list, sizes: list[int]):
        dev = self.mgr._device
        ds = None
        for pool in reversed(self.pools):
            try:
                ds = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
                    descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[layout]))[0]
                break
            except (vk.VkErrorOutOfPoolMemory, vk.VkErrorFragmentedPool):
                continue
        if ds is None:
            pool = self._new_pool()
            with _vk.call("vkAllocateDescriptorSets"):
                ds = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
                    descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[layout]))[0]
        self.owner[ds] = pool
        infos = [vk.VkDescriptorBufferInfo(buffer=b, offset=0, range=s) for b, s in zip(buffers, sizes)]
        writes = [vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=i, descriptorCount=1,
                                          descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info])
                  for i, info in enumerate(infos)]
        vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
        self.mgr._stats["descriptor_sets"] += 1
        return ds

    def free(self, ds) -> None:
        pool = self.owner.pop(ds, None)
        if pool is None or self.mgr._device is None:
            return
        vk.vkFreeDescriptorSets(self.mgr._device, pool, 1, [ds])
        self.mgr._stats["descriptor_sets"] -= 1

    def destroy(self) -> None:
        if self.mgr._device is None:
            self.pools, self.owner = [], {}
            return
        for pool in self.pools:
            vk.vkDestroyDescriptorPool(self.mgr._device, pool, None)
        self.pools = []
        self.owner = {}
