/* Vulkan entry points, loaded at run time from libvulkan.so.1 (vk_loader.c), so a
 * kvq built with Vulkan still starts where no loader is installed. Code calls them
 * by their usual names; the macros below route those to the loaded table. */
#ifndef KVQ_VK_FNS_H
#define KVQ_VK_FNS_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

/* X(name): every entry point kvq uses, without the vk prefix. */
#define KVQ_VK_FUNCS(X) \
    X(CreateInstance) \
    X(EnumerateInstanceVersion) \
    X(EnumerateInstanceExtensionProperties) \
    X(DestroyInstance) \
    X(EnumeratePhysicalDevices) \
    X(GetPhysicalDeviceProperties) \
    X(GetPhysicalDeviceProperties2) \
    X(GetPhysicalDeviceFeatures) \
    X(GetPhysicalDeviceFeatures2) \
    X(GetPhysicalDeviceMemoryProperties) \
    X(GetPhysicalDeviceMemoryProperties2) \
    X(GetPhysicalDeviceQueueFamilyProperties) \
    X(EnumerateDeviceExtensionProperties) \
    X(CreateDevice) \
    X(DestroyDevice) \
    X(GetDeviceQueue) \
    X(CreateBuffer) \
    X(DestroyBuffer) \
    X(GetBufferMemoryRequirements) \
    X(AllocateMemory) \
    X(FreeMemory) \
    X(BindBufferMemory) \
    X(MapMemory) \
    X(UnmapMemory) \
    X(CreateCommandPool) \
    X(DestroyCommandPool) \
    X(AllocateCommandBuffers) \
    X(BeginCommandBuffer) \
    X(EndCommandBuffer) \
    X(ResetCommandBuffer) \
    X(QueueSubmit) \
    X(CreateFence) \
    X(DestroyFence) \
    X(WaitForFences) \
    X(ResetFences) \
    X(GetFenceStatus) \
    X(CreateDescriptorSetLayout) \
    X(DestroyDescriptorSetLayout) \
    X(CreatePipelineLayout) \
    X(DestroyPipelineLayout) \
    X(CreateDescriptorPool) \
    X(DestroyDescriptorPool) \
    X(ResetDescriptorPool) \
    X(AllocateDescriptorSets) \
    X(UpdateDescriptorSets) \
    X(CreateShaderModule) \
    X(DestroyShaderModule) \
    X(CreateComputePipelines) \
    X(DestroyPipeline) \
    X(CmdBindPipeline) \
    X(CmdBindDescriptorSets) \
    X(CmdPushConstants) \
    X(CmdDispatch) \
    X(CmdPipelineBarrier) \
    X(CmdCopyBuffer) \
    X(CmdFillBuffer) \
    X(CreateQueryPool) \
    X(DestroyQueryPool) \
    X(CmdResetQueryPool) \
    X(CmdWriteTimestamp) \
    X(GetQueryPoolResults) \
    X(DeviceWaitIdle) \
    X(CreatePipelineCache) \
    X(DestroyPipelineCache) \
    X(GetPipelineCacheData)

typedef struct {
#define KVQ_VK_FIELD(n) PFN_vk##n n;
    KVQ_VK_FUNCS(KVQ_VK_FIELD)
#undef KVQ_VK_FIELD
} kvq_vk_fns;

extern kvq_vk_fns kvq_vk;

/* Opens the loader and the global entry points once per process; 0 on success, else a
 * one-line reason in why. */
int kvq_vk_load_global(char *why, size_t size);
/* Loads the instance-level (and device) entry points for inst. */
void kvq_vk_load_instance(VkInstance inst);

#define vkCreateInstance kvq_vk.CreateInstance
#define vkEnumerateInstanceVersion kvq_vk.EnumerateInstanceVersion
#define vkEnumerateInstanceExtensionProperties kvq_vk.EnumerateInstanceExtensionProperties
#define vkDestroyInstance kvq_vk.DestroyInstance
#define vkEnumeratePhysicalDevices kvq_vk.EnumeratePhysicalDevices
#define vkGetPhysicalDeviceProperties kvq_vk.GetPhysicalDeviceProperties
#define vkGetPhysicalDeviceProperties2 kvq_vk.GetPhysicalDeviceProperties2
#define vkGetPhysicalDeviceFeatures kvq_vk.GetPhysicalDeviceFeatures
#define vkGetPhysicalDeviceFeatures2 kvq_vk.GetPhysicalDeviceFeatures2
#define vkGetPhysicalDeviceMemoryProperties kvq_vk.GetPhysicalDeviceMemoryProperties
#define vkGetPhysicalDeviceMemoryProperties2 kvq_vk.GetPhysicalDeviceMemoryProperties2
#define vkGetPhysicalDeviceQueueFamilyProperties kvq_vk.GetPhysicalDeviceQueueFamilyProperties
#define vkEnumerateDeviceExtensionProperties kvq_vk.EnumerateDeviceExtensionProperties
#define vkCreateDevice kvq_vk.CreateDevice
#define vkDestroyDevice kvq_vk.DestroyDevice
#define vkGetDeviceQueue kvq_vk.GetDeviceQueue
#define vkCreateBuffer kvq_vk.CreateBuffer
#define vkDestroyBuffer kvq_vk.DestroyBuffer
#define vkGetBufferMemoryRequirements kvq_vk.GetBufferMemoryRequirements
#define vkAllocateMemory kvq_vk.AllocateMemory
#define vkFreeMemory kvq_vk.FreeMemory
#define vkBindBufferMemory kvq_vk.BindBufferMemory
#define vkMapMemory kvq_vk.MapMemory
#define vkUnmapMemory kvq_vk.UnmapMemory
#define vkCreateCommandPool kvq_vk.CreateCommandPool
#define vkDestroyCommandPool kvq_vk.DestroyCommandPool
#define vkAllocateCommandBuffers kvq_vk.AllocateCommandBuffers
#define vkBeginCommandBuffer kvq_vk.BeginCommandBuffer
#define vkEndCommandBuffer kvq_vk.EndCommandBuffer
#define vkResetCommandBuffer kvq_vk.ResetCommandBuffer
#define vkQueueSubmit kvq_vk.QueueSubmit
#define vkCreateFence kvq_vk.CreateFence
#define vkDestroyFence kvq_vk.DestroyFence
#define vkWaitForFences kvq_vk.WaitForFences
#define vkResetFences kvq_vk.ResetFences
#define vkGetFenceStatus kvq_vk.GetFenceStatus
#define vkCreateDescriptorSetLayout kvq_vk.CreateDescriptorSetLayout
#define vkDestroyDescriptorSetLayout kvq_vk.DestroyDescriptorSetLayout
#define vkCreatePipelineLayout kvq_vk.CreatePipelineLayout
#define vkDestroyPipelineLayout kvq_vk.DestroyPipelineLayout
#define vkCreateDescriptorPool kvq_vk.CreateDescriptorPool
#define vkDestroyDescriptorPool kvq_vk.DestroyDescriptorPool
#define vkResetDescriptorPool kvq_vk.ResetDescriptorPool
#define vkAllocateDescriptorSets kvq_vk.AllocateDescriptorSets
#define vkUpdateDescriptorSets kvq_vk.UpdateDescriptorSets
#define vkCreateShaderModule kvq_vk.CreateShaderModule
#define vkDestroyShaderModule kvq_vk.DestroyShaderModule
#define vkCreateComputePipelines kvq_vk.CreateComputePipelines
#define vkDestroyPipeline kvq_vk.DestroyPipeline
#define vkCmdBindPipeline kvq_vk.CmdBindPipeline
#define vkCmdBindDescriptorSets kvq_vk.CmdBindDescriptorSets
#define vkCmdPushConstants kvq_vk.CmdPushConstants
#define vkCmdDispatch kvq_vk.CmdDispatch
#define vkCmdPipelineBarrier kvq_vk.CmdPipelineBarrier
#define vkCmdCopyBuffer kvq_vk.CmdCopyBuffer
#define vkCmdFillBuffer kvq_vk.CmdFillBuffer
#define vkCreateQueryPool kvq_vk.CreateQueryPool
#define vkDestroyQueryPool kvq_vk.DestroyQueryPool
#define vkCmdResetQueryPool kvq_vk.CmdResetQueryPool
#define vkCmdWriteTimestamp kvq_vk.CmdWriteTimestamp
#define vkGetQueryPoolResults kvq_vk.GetQueryPoolResults
#define vkDeviceWaitIdle kvq_vk.DeviceWaitIdle
#define vkCreatePipelineCache kvq_vk.CreatePipelineCache
#define vkDestroyPipelineCache kvq_vk.DestroyPipelineCache
#define vkGetPipelineCacheData kvq_vk.GetPipelineCacheData

#endif
