// kbench's overlay for building ggml's Vulkan backend against Debian bookworm's Vulkan headers
// (1.3.239), which predate VK_EXT_layer_settings (1.3.261). ggml names three of its C++ types
// when it creates its instance; this file includes the real vulkan.hpp and, where the headers lack
// the extension, declares those types with the layout the Vulkan specification gives them.
// Written for kbench (scripts/build-ggml-peer.sh); it contains no ggml code.
#pragma once
#include_next <vulkan/vulkan.hpp>

#ifndef VK_EXT_layer_settings
#include <cstdint>
#include <vector>
namespace vk {
enum class LayerSettingTypeEXT : int32_t { eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4,
                                           eFloat32 = 5, eFloat64 = 6, eString = 7 };
struct LayerSettingEXT {
    const char* pLayerName;
    const char* pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void* pValues;
};
struct LayerSettingsCreateInfoEXT {
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
    const void* pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT* pSettings = nullptr;
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};
}  // namespace vk
#endif
